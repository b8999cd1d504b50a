"""Services behind the routes: streams, charts and exports (keyword-only functions)."""
