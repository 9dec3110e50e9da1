"""Admission webhooks: InferenceService mutation, cache validation, self-managed certificates."""
