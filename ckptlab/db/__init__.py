"""Database schema, engine and the data-access functions shared by backend and worker."""
