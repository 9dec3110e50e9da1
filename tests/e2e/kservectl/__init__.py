"""localcache beside KServe's own serving controllers (InferenceService, LLMInferenceService)."""
