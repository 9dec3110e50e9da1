"""Typed models of the serving.kserve.io/v1alpha1 LocalModel kinds and the ISVC subset we use."""
