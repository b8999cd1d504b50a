/* Puts the form's markup (form.html, served from this package like every asset) into
 * #view-new before form.js looks up its elements: form.js imports this module first, and a
 * module's top-level await holds its importers until the markup is in place. */

const resp = await fetch('/static/form.html');
document.getElementById('view-new').innerHTML = await resp.text();
