"""Admission webhooks, the domain handlers only: serving-object (InferenceService) mutation,
cache validation, and their wiring (`setup`). The server, TLS and the self-managed serving
certificates are the framework's (`runtime.serving`)."""
