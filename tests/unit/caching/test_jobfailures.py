"""A failed download's own reason, as it may be published: the gist of a log tail (fixed
vocabulary, never the log's own text) and the sanitising of deliberate messages."""

from __future__ import annotations

from typing import Any

import pytest

from localcache.caching import jobfailures as failures

# Log tails as KServe's storage initializer (kserve-storage 0.21) leaves them.
S3_403 = """\
2026-12-04 22:01:02.345 1 kserve ERROR [storage_errors.py:raise_storage_error():42] S3 error \
for s3://models/private/iris?X-Amz-Signature=abc: An error occurred (403) when calling the \
HeadBucket operation: Forbidden
Traceback (most recent call last):
  File "/opt/storage/lib/python3.13/site-packages/kserve_storage/kserve_storage.py", line 707
botocore.exceptions.ClientError: An error occurred (403) when calling the HeadBucket operation
RuntimeError: S3 error [403]: Forbidden
"""
HTTP_404 = """\
Traceback (most recent call last):
  File "/storage-initializer/scripts/initializer-entrypoint", line 37, in <module>
RuntimeError: HTTP resource not found at 'http://files.example:8080/models/iris.bin'.
"""
TAR_SLIP = """\
tarfile.OutsideDestinationError: '../../etc/passwd' would be extracted to '/etc/passwd', \
which is outside the destination
The above exception was the direct cause of the following exception:
RuntimeError: Failed to unpack archive file. The file format is not valid.
"""
BAD_ZIP = "RuntimeError: Failed to unpack archive file. The file format is not valid.\n"
BAD_URI = (
    "Exception: Cannot recognize storage type for foo://bar\n'gs://', 's3://', 'file://' ... "
    "are the current available storage types.\n"
)


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (S3_403, failures.GIST_S3_FORBIDDEN),
        ("Access denied to S3 resource 'b'. Verify permissions.", failures.GIST_S3_FORBIDDEN),
        ("HTTP access denied for 'http://h/m'. Verify permissions.", failures.GIST_FORBIDDEN),
        (HTTP_404, failures.GIST_NOT_FOUND),
        ("RuntimeError: S3 bucket 'x' does not exist.", failures.GIST_NOT_FOUND),
        (TAR_SLIP, failures.GIST_ARCHIVE_OUTSIDE),
        (BAD_ZIP, failures.GIST_ARCHIVE_INVALID),
        (BAD_URI, failures.GIST_INVALID_URI),
        ("HuggingFace authentication failed. Set HF_TOKEN", failures.GIST_UNAUTHORIZED),
        ("OSError: [Errno 28] No space left on device", failures.GIST_NO_SPACE),
        ("RuntimeError: Failed to connect to HTTP endpoint 'h'.", failures.GIST_CONNECT),
        ("some program output that means nothing to us", ""),
        ("", ""),
    ],
)  # fmt: skip
def test_gist_names_the_failure_in_a_fixed_vocabulary(tail: str, expected: str) -> None:
    found = failures.gist(tail)
    assert found == expected
    assert found == "" or found in failures.GISTS


def test_gist_never_carries_the_logs_own_text() -> None:
    """Risk 5: a tenant's log lines never reach the cluster-scoped status, even when they
    forge a recognised error: only the fixed phrase does."""
    forged = "Access denied to S3 resource 'tenant-secret-is-hunter2'"
    assert failures.gist(forged) == failures.GIST_S3_FORBIDDEN
    assert "hunter2" not in failures.gist(forged)


def test_sanitise_strips_credentials_query_strings_and_control_characters() -> None:
    text = (
        "line one\nfailed: https://user:pw@s3.example/b/k?X-Amz-Signature=deadbeef&X-Amz-"
        "Credential=AKIA token=abc123 password: hunter2 \x1b[31m"
    )
    out = failures.sanitise(text)
    assert out == (
        "failed: https://s3.example/b/k?<redacted> token=<redacted> password: <redacted> [31m"
    )
    assert len(failures.sanitise("x" * 5000)) == failures.POD_MESSAGE_LIMIT


def _failed_pod(term: dict[str, Any], *, policy: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c"}
    if policy is not None:
        container["terminationMessagePolicy"] = policy
    return {
        "metadata": {"creationTimestamp": "2026-12-04T22:00:00Z"},
        "spec": {"containers": [container]},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "c", "state": {"terminated": term}}],
        },
    }


def test_a_log_tail_gives_its_gist_with_the_exit_code() -> None:
    term = {"reason": "Error", "exitCode": 1, "message": S3_403}
    pod = _failed_pod(term, policy="FallbackToLogsOnError")
    assert failures.pod_failure_message([pod]) == "403 Forbidden from the S3 store (exit code 1)"


def test_an_unrecognised_log_tail_is_never_published() -> None:
    term = {"reason": "Error", "exitCode": 1, "message": "my-secret-value\nboom"}
    pod = _failed_pod(term, policy="FallbackToLogsOnError")
    assert failures.pod_failure_message([pod]) == "Error (exit code 1)"


def test_a_message_the_container_wrote_itself_is_published_sanitised() -> None:
    term = {"reason": "Error", "exitCode": 2, "message": "bad input at https://h/m?sig=1"}
    for policy in ("File", None):
        pod = _failed_pod(term, policy=policy)
        assert failures.pod_failure_message([pod]) == "bad input at https://h/m?<redacted>"


def test_an_import_pods_failed_init_container_speaks_and_a_stopped_sidecar_does_not() -> None:
    pod: dict[str, Any] = {
        "metadata": {"creationTimestamp": "2026-12-04T22:00:00Z"},
        "spec": {
            "initContainers": [
                {"name": "prepare"},
                {"name": "progress", "restartPolicy": "Always"},
                {"name": "download", "terminationMessagePolicy": "FallbackToLogsOnError"},
            ],
            "containers": [{"name": "place"}],
        },
        "status": {
            "phase": "Failed",
            "initContainerStatuses": [
                {
                    "name": "prepare",
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                },
                {
                    "name": "progress",
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                },
                {
                    "name": "download",
                    "state": {
                        "terminated": {"exitCode": 1, "reason": "Error", "message": "secret\nx"}
                    },
                },
            ],
            "containerStatuses": [
                {"name": "place", "state": {"waiting": {"reason": "PodInitializing"}}}
            ],
        },
    }
    assert failures.pod_failure_message([pod]) == "Error (exit code 1)"
    # a sidecar the kubelet stopped before it could exit 0 (a SIGTERM during its start-up)
    sidecar = pod["status"]["initContainerStatuses"][1]["state"]["terminated"]
    sidecar |= {"exitCode": 143, "reason": "Error"}
    assert failures.pod_failure_message([pod]) == "Error (exit code 1)"
    pod["status"]["initContainerStatuses"][2]["state"]["terminated"]["message"] = S3_403
    assert failures.pod_failure_message([pod]) == "403 Forbidden from the S3 store (exit code 1)"
    pod["status"]["initContainerStatuses"][2]["state"]["terminated"] = {"exitCode": 0}
    pod["status"]["containerStatuses"] = [
        {
            "name": "place",
            "state": {
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "message": "the download left no file in the staging folder",
                }
            },
        }
    ]
    assert failures.pod_failure_message([pod]) == "the download left no file in the staging folder"


def _waiting_pod(
    *,
    waiting: dict[str, str] | None = None,
    scheduled: dict[str, str] | None = None,
    phase: str = "Pending",
    created: str = "2026-01-01T00:00:00Z",
    uid: str = "job-uid",
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if waiting is not None:
        status["containerStatuses"] = [{"name": "d", "state": {"waiting": waiting}}]
    if scheduled is not None:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", **scheduled}]
    meta = {
        "creationTimestamp": created,
        "ownerReferences": [{"controller": True, "uid": uid}],
    }
    return {"metadata": meta, "status": status}


def test_a_pod_that_cannot_start_says_why_and_one_on_its_way_says_nothing() -> None:
    pull = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x:1"'}
    assert (
        failures.pod_waiting_message([_waiting_pod(waiting=pull)])
        == 'ImagePullBackOff: Back-off pulling image "x:1"'
    )
    secret = {"reason": "CreateContainerConfigError", "message": 'secret "s3" not found'}
    assert failures.pod_waiting_message([_waiting_pod(waiting=secret)]).startswith(
        "CreateContainerConfigError: "
    )
    assert failures.pod_waiting_message([_waiting_pod(waiting=secret)], detail=False) == (
        "CreateContainerConfigError"
    )
    unfit = {"reason": "Unschedulable", "message": "0/2 nodes are available"}
    assert (
        failures.pod_waiting_message([_waiting_pod(scheduled=unfit)])
        == "Unschedulable: 0/2 nodes are available"
    )
    for on_its_way in (
        _waiting_pod(waiting={"reason": "ContainerCreating"}),
        _waiting_pod(),
        _waiting_pod(waiting=pull, phase="Failed"),  # a failure speaks elsewhere
        _waiting_pod(waiting=pull, uid="another-job"),
    ):
        assert failures.pod_waiting_message([on_its_way], job_uid="job-uid") == ""
    # the newest pod speaks; its message is sanitised as any pod-supplied text
    older = _waiting_pod(waiting=pull, created="2026-01-01T00:00:00Z")
    leaky = {"reason": "ErrImagePull", "message": "pull https://u:p@r.example/x?sig=abc"}
    newer = _waiting_pod(waiting=leaky, created="2026-01-01T00:01:00Z")
    said = failures.pod_waiting_message([newer, older])
    assert said.startswith("ErrImagePull: ")
    assert "u:p@" not in said
    assert "sig=abc" not in said
