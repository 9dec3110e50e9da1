"""pytest-only pieces every test layer shares: the pytest plugin and its task-leak guard, the
S3 store (moto), the webhook test server, the install helpers of the profile tests, KServe's
add-on and the CRD-schema stripper. What `localcache run` also needs lives in
`localcache.devenv`."""
