"""The engine's side of a Python dynamic provider, written by us: launch the SDK's REAL provider host and
speak gRPC to it the way the Pulumi engine does.

Place in the flow: tests/pulumi_engine/test_*.py drive `reconciler.adapters.pulumi_provider` through the
real `python -m pulumi.dynamic` of the installed SDK. The Pulumi CLI cannot be installed here, so the two
pieces of the engine that matter are re-implemented from their documented behaviour (citations at
pulumi/pulumi@1b5949891b, file:line):

- `Project` / `launch`: the engine starts the plugin `pulumi-resource-pulumi-python` with its working
  directory set to the program's `main:` directory (pkg/engine/project.go:45-71, plugin.go:597-599) and
  `runtime.options.<k>` exported as `PULUMI_RUNTIME_<K>` plus `PULUMI_PROJECT` (provider_plugin.go:243-259).
  The launcher script (sdk/python/dist/pulumi-resource-pulumi-python:5-49) resolves a relative virtualenv
  against `$PWD`, and runs `$VENV/bin/python -u -m pulumi.dynamic <engine address>`, or fails with its
  "doesn't exist" message and exit 1. The host prints its port as one line on stdout (plugin.go:375-431).
- `EngineClient`: requests shaped as the engine sends them: Configure with the full stack config under
  namespaced keys and secrets wrapped in the secret signature (deploy/target.go:45-71), every number a
  protobuf double, preview unknowns as the UNKNOWN sentinel string.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from google.protobuf import json_format, struct_pb2
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

#: The wire form of a value not known yet (pulumi sdk/python/lib/pulumi/runtime/rpc.py UNKNOWN).
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
_SIG = "4dabf18193072939515e22adb298388d"
_SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
SLOT_TYPE = "pulumi-python:dynamic/fleet:Slot"


@dataclass(frozen=True)
class Secret:
    """A stack config value stored with --secret: the engine sends it wrapped in the secret signature."""

    value: Any


class LauncherError(RuntimeError):
    """The launcher script would have exited 1 with this message on stderr."""


@dataclass(frozen=True)
class Project:
    """What the engine reads from Pulumi.yaml to start a provider plugin."""

    root: Path
    name: str
    main: str | None
    runtime_options: Mapping[str, Any]

    @classmethod
    def load(cls, root: Path) -> Project:
        doc = yaml.safe_load((root / "Pulumi.yaml").read_text(encoding="utf-8"))
        runtime = doc.get("runtime")
        options = runtime.get("options", {}) if isinstance(runtime, dict) else {}
        return cls(root=root, name=doc["name"], main=doc.get("main"), runtime_options=dict(options or {}))

    def pwd(self) -> Path:
        """The plugin's working directory: `main:` if it is a directory, else its parent (getPwdMain)."""
        if not self.main:
            return self.root
        main = Path(self.main) if Path(self.main).is_absolute() else self.root / self.main
        return main if main.is_dir() else main.parent

    def plugin_env(self, base: Mapping[str, str]) -> dict[str, str]:
        env = dict(base)
        for key, value in self.runtime_options.items():
            # Go's fmt "%v": booleans print as true/false
            env[f"PULUMI_RUNTIME_{key.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
        env["PULUMI_PROJECT"] = self.name
        return env


def launch(pwd: Path, env: dict[str, str], engine_address: str) -> list[str]:
    """The launcher script's decision, as argv (mutates `env` as the script does: PATH, PYTHONHOME)."""
    venv = env.get("PULUMI_RUNTIME_VIRTUALENV", "")
    if not venv:
        toolchain = env.get("PULUMI_RUNTIME_TOOLCHAIN", "")
        if toolchain == "uv":
            venv = ".venv"
        elif toolchain == "poetry":
            raise LauncherError("toolchain poetry: `poetry env info --path` is not modelled here")
    if not venv:
        return [env.get("PULUMI_PYTHON_CMD", "python3"), "-u", "-m", "pulumi.dynamic", engine_address]
    venv = venv.rstrip("/") if venv != "/" else venv
    path = Path(venv) if venv.startswith("/") else Path(f"{pwd}/{venv}")  # $PWD/$VENV, not normalised
    if (path / "bin" / "python").is_file():
        env["PATH"] = f"{path}/bin:{env.get('PATH', '')}"
        env.pop("PYTHONHOME", None)
        return [f"{path}/bin/python", "-u", "-m", "pulumi.dynamic", engine_address]
    state = "doesn't appear to be a virtual environment" if path.is_dir() else "doesn't exist"
    raise LauncherError(f"The 'virtualenv' option in Pulumi.yaml is set to \"{path}\", but \"{path}\" {state}.")


class ProviderHost:
    """The SDK's provider host process, started as the engine starts it, and a gRPC stub to it."""

    def __init__(self, project: Project, *, env: Mapping[str, str] | None = None, log_path: Path,
                 start_timeout_s: float = 60.0):
        self.project = project
        self.log_path = log_path
        self.env = project.plugin_env(env if env is not None else os.environ)
        self.cwd = project.pwd()
        self.argv = launch(self.cwd, self.env, engine_address="127.0.0.1:1")  # the host never dials back
        self._start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: grpc.Channel | None = None
        self.port: int | None = None

    def start(self) -> ProviderHost:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        assert self.proc.stdout is not None
        line = b""
        deadline = time.monotonic() + self._start_timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while not line.endswith(b"\n"):  # the engine reads byte by byte up to the first newline
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    raise RuntimeError(f"provider host printed no port in {self._start_timeout_s}s: {self.stderr()}")
                byte = os.read(self.proc.stdout.fileno(), 1)  # unbuffered: select() sees what is left
                if not byte:
                    raise RuntimeError(f"provider host exited ({self.proc.wait()}) before printing its port: "
                                       f"{self.stderr()}")
                line += byte
        self.port = int(line.strip())
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        grpc.channel_ready_future(self.channel).result(timeout=30)
        return self

    def stderr(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def client(self, stack: str = "dev") -> EngineClient:
        assert self.channel is not None, "start() first"
        return EngineClient(provider_pb2_grpc.ResourceProviderStub(self.channel), self.project.name, stack)


@contextlib.contextmanager
def running_host(project: Project, log_path: Path, env: Mapping[str, str] | None = None) -> Iterator[ProviderHost]:
    host = ProviderHost(project, env=env, log_path=log_path)
    try:
        yield host.start()
    finally:
        host.stop()


# --- values on the wire ----------------------------------------------------------------------------------------


def _wire(value: Any) -> Any:
    if isinstance(value, Secret):
        return {_SIG: _SECRET_SIG, "value": _wire(value.value)}
    if isinstance(value, Mapping):
        return {str(k): _wire(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_wire(v) for v in value]
    return value


def to_struct(props: Mapping[str, Any]) -> struct_pb2.Struct:
    """What the engine puts on the wire: a protobuf Struct (every number becomes a double)."""
    s = struct_pb2.Struct()
    s.update(_wire(props))
    return s


def from_struct(s: struct_pb2.Struct) -> dict[str, Any]:
    return json_format.MessageToDict(s)


@dataclass
class EngineClient:
    """Engine-shaped requests to a provider host; props in and out are plain dicts (numbers as floats)."""

    stub: provider_pb2_grpc.ResourceProviderStub
    project: str
    stack: str
    timeout_s: float = 120.0
    calls: list[str] = field(default_factory=list)

    def urn(self, name: str) -> str:
        return f"urn:pulumi:{self.stack}::{self.project}::gpu-fleet:index:GpuPool${SLOT_TYPE}::{name}"

    def configure(self, config: Mapping[str, Any]) -> provider_pb2.ConfigureResponse:
        self.calls.append("Configure")
        variables = {k: str(v.value if isinstance(v, Secret) else v) for k, v in config.items()}
        req = provider_pb2.ConfigureRequest(variables=variables, args=to_struct(config), acceptSecrets=True,
                                            acceptResources=True, sends_old_inputs=True,
                                            sends_old_inputs_to_delete=True)
        return self.stub.Configure(req, timeout=self.timeout_s)

    def check(self, name: str, olds: Mapping[str, Any], news: Mapping[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        self.calls.append("Check")
        resp = self.stub.Check(provider_pb2.CheckRequest(urn=self.urn(name), olds=to_struct(olds), news=to_struct(news),
                                                         randomSeed=os.urandom(32), name=name, type=SLOT_TYPE),
                               timeout=self.timeout_s)
        return from_struct(resp.inputs), list(resp.failures)

    def diff(self, name: str, id_: str, state: Mapping[str, Any], news: Mapping[str, Any],
             old_inputs: Mapping[str, Any]) -> provider_pb2.DiffResponse:
        self.calls.append("Diff")
        return self.stub.Diff(provider_pb2.DiffRequest(id=id_, urn=self.urn(name), olds=to_struct(state),
                                                       news=to_struct(news), old_inputs=to_struct(old_inputs),
                                                       name=name, type=SLOT_TYPE), timeout=self.timeout_s)

    def create(self, name: str, inputs: Mapping[str, Any], timeout: float = 900.0) -> tuple[str, dict[str, Any]]:
        self.calls.append("Create")
        resp = self.stub.Create(provider_pb2.CreateRequest(urn=self.urn(name), properties=to_struct(inputs),
                                                           timeout=timeout, preview=False, name=name, type=SLOT_TYPE),
                                timeout=self.timeout_s)
        return resp.id, from_struct(resp.properties)

    def read(self, name: str, id_: str, state: Mapping[str, Any], inputs: Mapping[str, Any]) -> tuple[str, dict]:
        self.calls.append("Read")
        resp = self.stub.Read(provider_pb2.ReadRequest(id=id_, urn=self.urn(name), properties=to_struct(state),
                                                       inputs=to_struct(inputs), name=name, type=SLOT_TYPE),
                              timeout=self.timeout_s)
        return resp.id, from_struct(resp.properties)

    def update(self, name: str, id_: str, state: Mapping[str, Any], news: Mapping[str, Any],
               old_inputs: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append("Update")
        resp = self.stub.Update(provider_pb2.UpdateRequest(id=id_, urn=self.urn(name), olds=to_struct(state),
                                                           news=to_struct(news), timeout=600.0, preview=False,
                                                           old_inputs=to_struct(old_inputs), name=name,
                                                           type=SLOT_TYPE), timeout=self.timeout_s)
        return from_struct(resp.properties)

    def delete(self, name: str, id_: str, state: Mapping[str, Any], old_inputs: Mapping[str, Any]) -> None:
        self.calls.append("Delete")
        self.stub.Delete(provider_pb2.DeleteRequest(id=id_, urn=self.urn(name), properties=to_struct(state),
                                                    timeout=600.0, old_inputs=to_struct(old_inputs), name=name,
                                                    type=SLOT_TYPE), timeout=self.timeout_s)
