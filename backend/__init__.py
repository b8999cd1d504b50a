"""The ckptlab backend: REST API and the static frontend (FastAPI; never imports torch)."""
