"""nibbler_client: a small Python client for a nibbler worker.

Speaks proto/nibbler.proto over a ZeroMQ DEALER socket: one Request per call
with a fresh id, one Response with the same id (a reply that arrives after
its call timed out is recognised by its id and dropped). Uses Debian's
python3-zmq and python3-protobuf; the nibbler_pb2 module is generated at
build time (``protoc --python_out``) into ``<build>/python``: put that folder
on ``sys.path`` or ``PYTHONPATH``, or set ``NIBBLER_PB2_DIR``.

    from nibbler_client import NibblerClient
    with NibblerClient("ipc:///tmp/w.sock") as c:
        info = c.hello()
        out = c.generate([info.model.bos_id], max_tokens=32, gamma=4)
        print(out.tokens, out.acceptance_rate)
"""

import itertools
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Sequence

import zmq

if os.environ.get("NIBBLER_PB2_DIR"):
    sys.path.insert(0, os.environ["NIBBLER_PB2_DIR"])
import nibbler_pb2 as pb  # noqa: E402  (generated: see the module docstring)

PROTOCOL_VERSION = pb.PROTOCOL_VERSION


class NibblerError(Exception):
    """A worker status other than OK, or a client-side failure.

    code: the worker's nibbler.v1.Code value (e.g. pb.NO_FREE_BLOCKS), or
    None for a client-side failure (timeout, undecodable reply).
    """

    def __init__(self, code: Optional[int], message: str):
        self.code = code
        name = pb.Code.Name(code) if code is not None else "CLIENT"
        super().__init__(f"{name}: {message}")


class NibblerTimeout(NibblerError):
    def __init__(self, message: str):
        super().__init__(None, message)


@dataclass
class GenerateResult:
    tokens: List[int] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    finish_reason: str = "none"
    prefill_s: float = 0.0
    elapsed_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.elapsed_s if self.elapsed_s > 0 else 0.0


class NibblerClient:
    """One DEALER socket to one worker. Not thread safe: one client per thread."""

    def __init__(self, endpoint: str, timeout_ms: int = 120000, client_name: str = "python",
                 curve_server_key: Optional[bytes] = None,
                 curve_public_key: Optional[bytes] = None,
                 curve_secret_key: Optional[bytes] = None):
        self.endpoint = endpoint
        self.timeout_ms = timeout_ms
        self.client_name = client_name
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        keys = (curve_server_key, curve_public_key, curve_secret_key)
        if any(keys):
            if not all(keys):
                raise ValueError("CURVE needs the server key and the client key pair")
            self._sock.curve_serverkey = curve_server_key
            self._sock.curve_publickey = curve_public_key
            self._sock.curve_secretkey = curve_secret_key
        self._sock.connect(endpoint)
        self._ids = itertools.count(random.getrandbits(48) + 1)
        self._seq_ids = itertools.count(random.getrandbits(60) + 1)

    def close(self) -> None:
        self._sock.close()
        self._ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ transport

    def call(self, req: "pb.Request", check: bool = True) -> "pb.Response":
        """Sends req (its id is set here) and returns the Response with that id.

        Raises NibblerTimeout when no reply comes within timeout_ms, and, when
        check is true, NibblerError for a request status other than OK or for
        the first sequence in a batch result whose status is not OK.
        """
        req.id = next(self._ids)
        self._sock.send(req.SerializeToString())
        deadline = None if self.timeout_ms < 0 else time.monotonic() + self.timeout_ms / 1000
        while True:
            wait = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            if not self._sock.poll(wait):
                raise NibblerTimeout(f"no reply from {self.endpoint} to request {req.id} "
                                     f"within {self.timeout_ms} ms")
            frames = self._sock.recv_multipart()
            resp = pb.Response()
            try:
                resp.ParseFromString(frames[-1])
            except Exception as e:  # protobuf raises DecodeError
                raise NibblerError(None, f"undecodable reply: {e}") from e
            if resp.id != req.id:
                continue  # stale: the reply to a request that timed out
            if check:
                if resp.status.code != pb.OK:
                    raise NibblerError(resp.status.code, resp.status.message)
                if resp.WhichOneof("result") == "batch":
                    for s in resp.batch.seqs:
                        if s.status.code != pb.OK:
                            raise NibblerError(s.status.code,
                                               f"seq {s.seq_id}: {s.status.message}")
            return resp

    # ------------------------------------------------------------ commands

    def hello(self) -> "pb.HelloResult":
        req = pb.Request()
        req.hello.protocol_version = PROTOCOL_VERSION
        req.hello.client_name = self.client_name
        return self.call(req).hello

    def add_sequence(self, seq_id: int, temperature: float = 0.0, top_k: int = 0,
                     top_p: float = 1.0, seed: int = 0, eos_ids: Iterable[int] = (),
                     max_tokens: int = 0) -> "pb.BatchResult":
        req = pb.Request()
        s = req.add_sequence.seqs.add()
        s.seq_id = seq_id
        s.sampling.temperature = temperature
        s.sampling.top_k = top_k
        s.sampling.top_p = top_p
        s.sampling.seed = seed
        s.stop.eos_ids.extend(eos_ids)
        s.stop.max_tokens = max_tokens
        return self.call(req).batch

    def prefill(self, seq_id: int, tokens: Sequence[int],
                logprobs: bool = False) -> "pb.SequenceResult":
        req = pb.Request()
        it = req.prefill.items.add()
        it.seq_id = seq_id
        it.tokens.extend(tokens)
        req.prefill.return_logprobs = logprobs
        return self.call(req).batch.seqs[0]

    def speculate(self, seq_ids: Sequence[int], gamma: int,
                  logprobs: bool = False) -> "pb.BatchResult":
        req = pb.Request()
        req.speculate.seq_ids.extend(seq_ids)
        req.speculate.gamma = gamma
        req.speculate.return_logprobs = logprobs
        return self.call(req).batch

    def draft(self, seq_ids: Sequence[int], gamma: int) -> "pb.BatchResult":
        req = pb.Request()
        req.draft.seq_ids.extend(seq_ids)
        req.draft.gamma = gamma
        return self.call(req).batch

    def verify(self, seq_ids: Sequence[int], logprobs: bool = False) -> "pb.BatchResult":
        req = pb.Request()
        req.verify.seq_ids.extend(seq_ids)
        req.verify.return_logprobs = logprobs
        return self.call(req).batch

    def decode(self, seq_ids: Sequence[int], n: int, logprobs: bool = False) -> "pb.BatchResult":
        req = pb.Request()
        req.decode.seq_ids.extend(seq_ids)
        req.decode.n = n
        req.decode.return_logprobs = logprobs
        return self.call(req).batch

    def rollback(self, seq_id: int, n_tokens: int) -> "pb.BatchResult":
        req = pb.Request()
        it = req.rollback.items.add()
        it.seq_id = seq_id
        it.n_tokens = n_tokens
        return self.call(req).batch

    def free(self, seq_ids: Sequence[int]) -> "pb.BatchResult":
        req = pb.Request()
        req.free.seq_ids.extend(seq_ids)
        return self.call(req).batch

    def fork(self, parent_id: int, child_id: int) -> "pb.BatchResult":
        req = pb.Request()
        req.fork.parent_id = parent_id
        req.fork.child_id = child_id
        return self.call(req).batch

    def stats(self) -> "pb.StatsResult":
        req = pb.Request()
        req.stats.SetInParent()
        return self.call(req).stats

    def health(self) -> "pb.HealthResult":
        req = pb.Request()
        req.health.SetInParent()
        return self.call(req).health

    def shutdown(self) -> None:
        req = pb.Request()
        req.shutdown.SetInParent()
        self.call(req)

    # ------------------------------------------------------------ generation

    def generate(self, prompt: Sequence[int], max_tokens: int, mode: str = "spec",
                 gamma: int = 4, temperature: float = 0.0, seed: int = 0,
                 eos_ids: Iterable[int] = ()) -> GenerateResult:
        """AddSequence, Prefill, then Speculate (mode "spec") or Decode ("ar")
        rounds until max_tokens tokens or an eos id; always frees the sequence."""
        eos = set(eos_ids)
        seq = next(self._seq_ids)
        out = GenerateResult()
        self.add_sequence(seq, temperature=temperature, seed=seed, eos_ids=sorted(eos),
                          max_tokens=max_tokens)
        try:
            t0 = time.monotonic()

            def take(s) -> bool:
                for t in s.tokens:
                    if len(out.tokens) >= max_tokens:
                        break
                    out.tokens.append(t)
                    if t in eos:
                        out.finish_reason = "eos"
                        return True
                if s.finish_reason != pb.NOT_FINISHED:
                    out.finish_reason = pb.FinishReason.Name(s.finish_reason).lower()
                    return True
                if len(out.tokens) >= max_tokens:
                    out.finish_reason = "max_tokens"
                    return True
                return False

            done = take(self.prefill(seq, prompt))
            out.prefill_s = time.monotonic() - t0
            while not done:
                try:
                    if mode == "spec":
                        s = self.speculate([seq], gamma).seqs[0]
                    else:
                        s = self.decode([seq], 1).seqs[0]
                except NibblerError as e:
                    if e.code == pb.FINISHED:
                        out.finish_reason = "max_tokens"
                        break
                    raise
                out.rounds += 1
                out.drafted += s.n_drafted
                out.accepted += s.n_accepted
                done = take(s)
            out.elapsed_s = time.monotonic() - t0
        finally:
            self.free([seq])
        return out
