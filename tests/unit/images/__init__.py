"""Tests of the local image build (hack/mkimage.py, install-localcache.sh, build-images.sh)."""
