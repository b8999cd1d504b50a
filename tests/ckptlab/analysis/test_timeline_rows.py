"""A memory timeline as stored and as the prediction process sends it (issue 34): the row's
figures are the timeline's, the JSON form reads back as the row, and a row that is not one
is refused naming the field (the backend then stores the prediction without it)."""

from __future__ import annotations

import json

import pytest

from ckptlab.analysis.timeline import TimelineFormatError, decode
from ckptlab.analysis.timeline_rows import row_from_json, row_to_json, timeline_row
from tests.ckptlab.analysis.test_timeline import small


def test_a_row_holds_the_timelines_figures_and_reads_back_from_json():
    tl = small()
    row = timeline_row(tl, True)
    assert (row["step"], row["is_peak"], row["n_events"]) == (3, True, 5)
    assert (row["baseline_bytes"], row["peak_bytes"], row["peak_index"]) == (150, 270, 1)
    assert decode(row["data"]).peak() == (270, 1)
    assert row_from_json(json.loads(json.dumps(row_to_json(row)))) == row


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"step": 0}, "step"),
        ({"n_events": "5"}, "n_events"),
        ({"peak_bytes": True}, "peak_bytes"),
        ({"baseline_bytes": 2**63}, "baseline_bytes"),
        ({"peak_index": -2}, "peak_index"),
        ({"is_peak": 1}, "is_peak"),
        ({"data": "***"}, "base64"),
        ({"data": None}, "base64"),
        ({"data": "SlVOSw=="}, "not a stored memory timeline"),  # b"JUNK"
    ],
)
def test_a_row_that_is_not_one_is_refused_naming_the_field(change, field):
    sent = {**row_to_json(timeline_row(small(), False)), **change}
    with pytest.raises(TimelineFormatError, match=field):
        row_from_json(sent)
    with pytest.raises(TimelineFormatError, match="JSON object"):
        row_from_json([sent])
