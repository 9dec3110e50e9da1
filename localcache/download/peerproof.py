"""Cross-scope proofs, the fetcher's side: before a peer of another credential scope serves
this download pod, its agent runs, at the S3 origin, presigned HEADs this pod produced for
every file of the model (`localcache fetch --prove-s3`; the serving side is
`agent.peer.proofs`).

Contract:
- The origin's settings, listing and presigns: `download.s3origin`.
- `prove(request, board, uri=, origin=)`: lists once, then asks every live source of `board`
  (at once) for a nonce (`GET /p2p/v1/models/{key}/proofs/nonce`) and sends it a proof
  presigned afresh with that nonce (`POST .../proofs`), over the fetcher's TLS session
  (`peerfetch.session`) with the bearer token. A source that gives no nonce is refused. A
  200 `proven` answer (whose digest, if any, is the one asked for) keeps the source; any
  other answer bans it for the run (`Board.ban`, in rank order once all have answered) with
  the status and the answer's reason: 429 is asked again up to `PROOF_ATTEMPTS` times in all
  (Retry-After honoured, at most `MAX_BUSY_WAIT_S`); 403, 409, 5xx, a transport or TLS
  failure, an answer over `MAX_ANSWER_BYTES` or one that does not parse are refusals. The
  whole proof runs within `request.deadline`, each POST within `PROOF_TIMEOUT_S`.
- Errors: `peersources.FetchError`. "Use origin" when the origin refuses or cannot serve the
  listing or presign (no credentials, AccessDenied, no such bucket, anonymous), when no object
  is found, and when no source accepts the proof (its reason lists theirs); a local failure
  (an unreadable token file) otherwise. `originpaths.parse_s3` raises `ValueError`.
- Never logged or put in a reason: credentials and presigned URLs (they carry signatures);
  only counts, node names, statuses and the peers' reasons.
Not promised: that a source which accepted serves the files (the transfer checks them), nor
that the listing is the one the origin Job would see later (objects may change meanwhile).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Final

import aiohttp
import pydantic
import structlog
import yarl

from localcache.api import peer
from localcache.download import peerfetch, peersources, s3origin

log = structlog.get_logger(__name__)

PROOF_ATTEMPTS: Final = 3
MAX_BUSY_WAIT_S: Final = 5.0
PROOF_TIMEOUT_S: Final = 600.0
"""One POST: the serving node runs the HEADs at once, then may hash the model (MD5, once per
folder) before it answers."""
MAX_ANSWER_BYTES: Final = 4096


async def prove(
    request: peerfetch.Request, board: peersources.Board, *, uri: str, origin: s3origin.S3Origin
) -> None:
    """Prove access to `uri` to every live source of `board` (module doc); the sources that
    refuse are banned; "use origin" when none accepts."""
    if not board.live():
        raise peersources.use_origin("no peer source given")
    try:
        async with asyncio.timeout(request.deadline):
            objects = await asyncio.to_thread(origin.objects, uri)
            log.info("fetch.proof_listed", objects=len(objects), sources=len(board.live()))
            async with peerfetch.session(request) as client, asyncio.TaskGroup() as group:
                proof = _Proof(request, client, uri=uri, origin=origin, objects=objects)
                asked = {
                    source: group.create_task(
                        proof.to(source), name=f"localcache-proof-{source.node}"
                    )
                    for source in board.live()
                }
    except TimeoutError:
        raise peersources.use_origin(
            f"the proof did not finish within {request.deadline:g} s (--deadline)"
        ) from None
    except BaseExceptionGroup as errors:
        raise peersources.first_error(errors) from None
    for source, task in asked.items():  # in rank order, whichever answered first
        why = task.result()
        if why is not None:
            board.ban(source, f"proof refused: {why}")
    if not board.live():
        raise peersources.use_origin(f"no peer accepted the proof: {board.why_banned()}")


class _Proof:
    def __init__(
        self,
        request: peerfetch.Request,
        client: aiohttp.ClientSession,
        *,
        uri: str,
        origin: s3origin.S3Origin,
        objects: list[s3origin.S3Object],
    ) -> None:
        self.request = request
        self.client = client
        self.uri = uri
        self.origin = origin
        self.objects = objects

    async def to(self, source: peersources.Source) -> str | None:
        """Prove to `source`: None when it accepts, else why not."""
        for attempt in range(1, PROOF_ATTEMPTS + 1):
            status, said, wait = await self._exchange(source, "nonce", None)
            nonce = _nonce(said) if status == 200 else None
            if nonce is None:
                answer: peer.ProofAnswer | str = f"no nonce: {peersources.short(said)}"
                break
            body = await asyncio.to_thread(self._body, nonce)  # signed afresh: they live 60 s
            status, said, wait = await self._exchange(source, "", body)
            answer = _answer(said)
            if status == 429 and attempt < PROOF_ATTEMPTS:
                await self.request.clock.sleep(min(wait, MAX_BUSY_WAIT_S))
                continue
            break
        why = _refusal(status, answer, self.request.digest)
        if why is None:
            log.info("fetch.proof_accepted", source=source.node, files=len(self.objects))
        else:
            log.info("fetch.proof_refused", source=source.node, reason=why, attempts=attempt)
        return why

    def _body(self, nonce: str) -> bytes:
        proof = self.origin.proof(self.uri, self.objects, nonce)
        return proof.model_dump_json(by_alias=True).encode()

    async def _exchange(
        self, source: peersources.Source, path: str, body: bytes | None
    ) -> tuple[int | str, bytes | str, float]:
        """POST `body` to `.../proofs` (GET `.../proofs/<path>` without one): (status or a
        transport failure, the answer's bytes or what went wrong, Retry-After)."""
        url = f"{source.url}{peer.WIRE_PREFIX}/models/{self.request.storage_key}/proofs"
        url += f"/{path}" if path else ""
        timeout = aiohttp.ClientTimeout(
            total=PROOF_TIMEOUT_S,
            connect=self.request.connect_timeout,
            sock_connect=self.request.connect_timeout,
        )
        headers = {
            **self.request.credentials.headers(),
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
        }
        try:
            async with self.client.request(
                "GET" if body is None else "POST",
                yarl.URL(url, encoded=True),
                data=body,
                headers=headers,
                ssl=self.request.credentials.ssl,
                server_hostname=self.request.server_name,
                allow_redirects=False,
                timeout=timeout,
            ) as resp:
                wait = peersources.retry_after(resp.headers.get("Retry-After"), fallback=1.0)
                raw = bytearray()
                async for chunk in resp.content.iter_chunked(MAX_ANSWER_BYTES):
                    raw += chunk
                    if len(raw) > MAX_ANSWER_BYTES:
                        return resp.status, f"an answer over {MAX_ANSWER_BYTES} bytes", wait
        except (ssl.SSLError, aiohttp.ClientSSLError) as exc:
            return "TLS", peersources.short(exc), 0.0
        except (aiohttp.ClientError, TimeoutError) as exc:
            return "transport", peersources.short(exc) or "timed out", 0.0
        return resp.status, bytes(raw), wait


def _answer(said: bytes | str) -> peer.ProofAnswer | str:
    """The answer to a proof, or its text (e.g. the server's plain-text refusals)."""
    if isinstance(said, str):
        return said
    try:
        return peer.ProofAnswer.model_validate_json(said)
    except pydantic.ValidationError:
        return said.decode("utf-8", "replace")


def _nonce(said: bytes | str) -> str | None:
    try:
        return peer.ProofNonce.model_validate_json(said).nonce
    except pydantic.ValidationError:
        return None


def _refusal(status: int | str, answer: peer.ProofAnswer | str, digest: str) -> str | None:
    """None when `answer` accepts the proof (for `digest`); else a short reason."""
    if isinstance(answer, peer.ProofAnswer):
        if status == 200 and answer.proven:
            if answer.digest is None or digest in (peer.FOLLOW, answer.digest):
                return None
            return "HTTP 200, proven for another digest"
        said = answer.reason or ""
    else:
        said = answer
    head = f"HTTP {status}" if isinstance(status, int) else status
    said = peersources.short(said)[:80]
    return f"{head} ({said})" if said else head
