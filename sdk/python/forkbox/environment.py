"""Environment: a declarative baseline (image + resources + setup) built once
into a warm snapshot keyed by the hash of its definition; env.sandbox() hands
over a fork of it (or a pooled one).

Setup is either a list of steps run by the daemon (BuildEnvironment), or a
callable run by this client against a builder sandbox, through the build
lease the TypeScript SDK uses: BeginBuild returns the environment if its hash
is built (waiting while another caller builds it), else a builder sandbox and
a lease; the callable runs, and CompleteBuild keeps (ok) or drops the result.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import marshal
import re
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

from ._models import (
    BuildProgress,
    BuildResult,
    EnvironmentInfo,
    Handover,
    Overrides,
    Resources,
    SandboxInfo,
    Step,
    step_to_json,
)
from .errors import InternalError, InvalidArgumentError, UnavailableError

if TYPE_CHECKING:
    from .client import Client
    from .sandbox import Sandbox

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def max_age_seconds(v: Union[int, float, str, None]) -> int:
    """Seconds, or a string "30m", "12h", "7d"."""
    if v is None:
        return 0
    if isinstance(v, (int, float)):
        return int(v)
    m = re.fullmatch(r"(\d+)([smhd]?)", v.strip())
    if not m:
        raise InvalidArgumentError(f"max_age {v!r}: want seconds or a number with s, m, h or d")
    return int(m.group(1)) * _UNITS[m.group(2) or "s"]


def setup_source(fn: Callable[..., Any]) -> bytes:
    """What identifies a setup callable's code: its source text, or, when
    there is none (defined in a REPL), its compiled code."""
    try:
        return inspect.getsource(fn).encode("utf-8")
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        if code is None:
            raise InvalidArgumentError(f"setup {fn!r}: a function or a list of steps")
        return marshal.dumps(code)


def start_to_json(s: Union[str, Mapping[str, Any]]) -> Dict[str, Any]:
    """A start command (what the environment leaves running; gVisor only):
    a shell string, or {"run", "ready_port", "ready_command",
    "ready_timeout_ms"}."""
    if isinstance(s, str):
        s = {"run": s}
    unknown = set(s) - {"run", "ready_port", "ready_command", "ready_timeout_ms"}
    if unknown or not s.get("run"):
        raise InvalidArgumentError(f"start {s!r}: want a command or a mapping with run, ready_port, ready_command, ready_timeout_ms")
    return {
        "run": s["run"],
        "readyPort": int(s.get("ready_port") or 0),
        "readyCommand": s.get("ready_command") or "",
        "readyTimeoutMs": str(int(s.get("ready_timeout_ms") or 0)),
    }


class _Definition:
    """The definition both the sync and the asyncio environments send."""

    def __init__(
        self,
        name: str,
        image: str,
        *,
        setup: Union[Sequence[Any], Callable[..., Any], None],
        resources: Union[Resources, Mapping[str, Any], None],
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        runtime: Optional[str],
        egress: Optional[str],
        max_age: Union[int, float, str, None],
        pool_size: int,
        start: Union[str, Mapping[str, Any], None] = None,
    ) -> None:
        res = Resources.of(resources)
        self.name = name
        self.setup_fn: Optional[Callable[..., Any]] = None
        self.json: Dict[str, Any] = {
            "name": name,
            "image": image,
            "env": dict(env or {}),
            "cwd": cwd or "",
            "runtime": runtime or "",
            "egress": egress or "",
            "maxAgeSeconds": str(max_age_seconds(max_age)),
            "poolSize": pool_size,
        }
        if res is not None:
            self.json["resources"] = res.to_json()
        if start is not None:
            self.json["start"] = start_to_json(start)
        if callable(setup):
            self.setup_fn = setup
            rest = json.dumps(self.json, sort_keys=True).encode("utf-8")
            self.json["setupHash"] = hashlib.sha256(setup_source(setup) + b"\0" + rest).hexdigest()
        else:
            self.json["steps"] = [step_to_json(s) for s in (setup or [])]

    def overrides(self, o: Union[Overrides, Mapping[str, Any], None]) -> Dict[str, Any]:
        msg: Dict[str, Any] = {"definition": self.json}
        ov = Overrides.of(o)
        if ov is not None:
            msg["overrides"] = ov.to_json()
        return msg


def _begin(begin: Dict[str, Any]) -> Tuple[Optional[EnvironmentInfo], Optional[SandboxInfo], str]:
    if begin.get("environment") and not begin.get("builder"):
        return EnvironmentInfo.from_json(begin["environment"]), None, ""
    if not begin.get("builder") or not begin.get("lease"):
        raise InternalError("BeginBuild returned neither an environment nor a builder")
    return None, SandboxInfo.from_json(begin["builder"]), begin["lease"]


class Environment:
    """An environment of a client. Nothing is called until sandbox() or build()."""

    def __init__(
        self,
        client: "Client",
        name: str,
        *,
        image: str,
        setup: Union[
            Sequence[Union[Step, Mapping[str, Any]]], Callable[["Sandbox"], Any], None
        ] = None,
        resources: Union[Resources, Mapping[str, Any], None] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        runtime: Optional[str] = None,
        egress: Optional[str] = None,
        max_age: Union[int, float, str, None] = None,
        pool_size: int = 0,
        start: Union[str, Mapping[str, Any], None] = None,
    ) -> None:
        self.client = client
        self.name = name
        self._def = _Definition(
            name,
            image,
            setup=setup,
            resources=resources,
            env=env,
            cwd=cwd,
            runtime=runtime,
            egress=egress,
            max_age=max_age,
            pool_size=pool_size,
            start=start,
        )

    def _call(self, method: str, message: Dict[str, Any]) -> Dict[str, Any]:
        return self.client._transport.unary("EnvironmentService", method, message)

    def build(self, on_progress: Optional[Callable[[BuildProgress], None]] = None) -> BuildResult:
        """Builds the environment unless it is built (concurrent builds of
        one definition, from any client, make one build). Step setups report
        their progress to on_progress."""
        if self._def.setup_fn is not None:
            return self._run_setup()
        env: Optional[EnvironmentInfo] = None
        built = False
        for m in self.client._transport.stream(
            "EnvironmentService", "BuildEnvironment", {"definition": self._def.json}
        ):
            p = BuildProgress.from_json(m)
            if p.phase in ("step", "create"):
                built = True
            if p.environment is not None:
                env = p.environment
            if on_progress is not None:
                on_progress(p)
        if env is None:
            raise UnavailableError("build stream ended without an environment")
        return BuildResult(environment=env, built=built)

    def sandbox(self, overrides: Union[Overrides, Mapping[str, Any], None] = None) -> "Sandbox":
        """A sandbox of the environment: from its warm pool when one is
        ready, else forked from its snapshot, built first if needed. Holds a
        slot until close(); ``sb.handover.built`` says whether this call built
        the environment."""
        built_here = self._run_setup().built if self._def.setup_fn is not None else False
        return self._hand_over(overrides, built_here)

    def _hand_over(
        self, overrides: Union[Overrides, Mapping[str, Any], None], built_here: bool
    ) -> "Sandbox":
        """EnvironmentSandbox, once a client-run setup (if any) has run."""
        from .sandbox import Sandbox

        self.client._acquire(1)
        try:
            r = self._call("EnvironmentSandbox", self._def.overrides(overrides))
        except BaseException:
            self.client._release(1)
            raise
        sb = Sandbox(
            self.client, SandboxInfo.from_json(r.get("sandbox") or {}), self.client._limited
        )
        sb.handover = Handover(
            built=bool(r.get("built")) or built_here,
            from_pool=bool(r.get("fromPool")),
            handover_ms=float(r.get("handoverMs", 0)),
        )
        return sb

    def info(self) -> EnvironmentInfo:
        """The environment as the daemon knows it (NotFoundError before its first build)."""
        return EnvironmentInfo.from_json(
            self._call("GetEnvironment", {"name": self.name}).get("environment") or {}
        )

    def delete(self) -> None:
        """Deletes the environment (its snapshot and pool)."""
        self._call("DeleteEnvironment", {"name": self.name})

    def _run_setup(self) -> BuildResult:
        from .sandbox import Sandbox

        env, builder, lease = _begin(self._call("BeginBuild", {"definition": self._def.json}))
        if env is not None:
            return BuildResult(environment=env, built=False)
        assert builder is not None and self._def.setup_fn is not None
        try:
            self._def.setup_fn(Sandbox(self.client, builder, False))
        except BaseException as e:
            try:
                self._call(
                    "CompleteBuild",
                    {"lease": lease, "ok": False, "error": str(e) or type(e).__name__},
                )
            except Exception:
                pass
            raise
        done = self._call("CompleteBuild", {"lease": lease, "ok": True})
        return BuildResult(
            environment=EnvironmentInfo.from_json(done.get("environment") or {}), built=True
        )

    def __repr__(self) -> str:
        return f"<Environment {self.name!r}>"
