"""Tests of the test servers the end-to-end test bed runs: the S3 store and the model server."""
