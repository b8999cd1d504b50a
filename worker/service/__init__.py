"""The worker service: slots that claim runs, their child processes, step writer, heartbeat, outcome."""
