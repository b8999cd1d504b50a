/* Live streams (Server-Sent Events) that resume after a dropped connection or a server
 * restart, and the badge that says so. */

import { $, connectionChanged } from './util.js';

/**
 * An EventSource with typed handlers that resumes for as long as the view is open and stops
 * for good on the server's `end` event.
 *
 * The browser itself reconnects a dropped stream and sends `Last-Event-ID`; when it gives up
 * (the server answered an error while restarting, say: readyState CLOSED), a new stream is
 * opened with the last event id as the `last_event_id` query parameter (an EventSource
 * cannot set headers), after a back-off of 1, 2, 4, then every 5 s. The server resumes after
 * that id, so no step is missed or repeated. `onState(state)` lets the view say so:
 * 'live' once open, 'reconnecting' after a drop, 'unavailable' when the stream has never
 * opened (a proxy that refuses event streams: the view polls meanwhile, and the stream
 * keeps trying).
 */
const MAX_BACKOFF_MS = 5000;

export class LiveStream {
  constructor(url, handlers, { onState } = {}) {
    this.url = url;
    this.handlers = handlers;
    this.onState = onState || (() => {});
    this.closed = false;
    this.lastEventId = '';
    this.everOpened = false;
    this.backoffMs = 1000;
    this.timer = null;
    this.onState('live');
    this.open(url);
  }

  open(url) {
    const source = new EventSource(url);
    this.source = source;
    for (const [kind, fn] of Object.entries(this.handlers)) {
      source.addEventListener(kind, (ev) => {
        if (this.closed || source !== this.source) return;
        if (ev.lastEventId) this.lastEventId = ev.lastEventId;
        let data = null;
        try {
          data = JSON.parse(ev.data);
        } catch (_) {
          return;
        }
        fn(data);
      });
    }
    source.addEventListener('end', () => this.close());
    source.addEventListener('open', () => {
      if (source !== this.source) return;
      this.backoffMs = 1000;
      this.everOpened = true;
      connectionChanged(true);
      this.onState('live');
    });
    source.addEventListener('error', () => {
      if (this.closed || source !== this.source) return;
      this.onState(this.everOpened ? 'reconnecting' : 'unavailable');
      if (source.readyState !== EventSource.CLOSED) return; // the browser retries by itself
      source.close();
      const wait = this.backoffMs;
      this.backoffMs = Math.min(2 * this.backoffMs, MAX_BACKOFF_MS);
      this.timer = setTimeout(() => {
        if (this.closed) return;
        const sep = this.url.includes('?') ? '&' : '?';
        const resume = this.lastEventId ? `${sep}last_event_id=${encodeURIComponent(this.lastEventId)}` : '';
        this.open(`${this.url}${resume}`);
      }, wait);
    });
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.timer);
    this.source.close();
  }
}

/**
 * An `onState` for LiveStream that shows 'live' or 'reconnecting…' in the badge `id`, and
 * calls `onUnavailable` once if the stream never opened (the view then polls).
 */
export function liveBadge(id, onUnavailable) {
  let polling = false;
  return (state) => {
    if (state === 'unavailable') {
      $(id).hidden = true;
      if (!polling && onUnavailable) onUnavailable();
      polling = true;
      return;
    }
    const badge = $(id);
    const reconnecting = state === 'reconnecting';
    badge.textContent = reconnecting ? 'reconnecting…' : 'live';
    badge.classList.toggle('reconnecting', reconnecting);
  };
}
