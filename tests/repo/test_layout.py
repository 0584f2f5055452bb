"""The package layout holds its rules: no import loops (function-local imports included), every module imports
on its own in a fresh interpreter, no module over 800 lines (one concept a module, as vLLM's and SGLang's run),
engine_stub never imports the CLI nor the relay sources, and engine_stub is imported only where a command runs it
(the local engine sources, `detok engine-server`, `detok trace synth`'s corpus), never by the relays; only the
front's HTTP edge (front/edge.py) imports uvicorn's and Starlette's private modules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from helpers.fixtures import REPO
from helpers.vllm_cpu import require_venv

from detok_worker.engine.sources.factory import RELAY_SOURCES

PACKAGES = ("detok_worker", "engine_stub")
MAX_LINES = 800


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "bench_scripts" in path.parts or "configs" in path.parts:
                continue  # links to bench/ and configs/: scripts and data, not modules of the package
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def import_graph(found: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules it imports (at module level or inside a function), and the packages whose
    __init__ that import runs."""

    def resolve(name: str) -> str | None:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                own_package = name.startswith(node.module + ".")
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
                targets += [] if own_package else [node.module]
            else:
                continue
            for target in targets:
                module = resolve(target)
                if module is None or module == name:
                    continue
                graph[name].add(module)
                parts = module.split(".")
                for depth in range(1, len(parts)):
                    package = ".".join(parts[:depth])
                    if package in found and not name.startswith(package + "."):
                        graph[name].add(package)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_loop() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_loops() -> None:
    assert cycles(import_graph(modules())) == []


def test_no_import_loops_among_the_bench_scripts() -> None:
    """bench/ scripts import each other by plain module name (the folder is on sys.path when one runs)."""
    scripts = {path.stem: path for path in sorted((REPO / "bench").glob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in scripts}
    for name, path in scripts.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                graph[name] |= {alias.name for alias in node.names if alias.name in scripts}
            elif isinstance(node, ast.ImportFrom) and node.module in scripts and node.level == 0:
                graph[name].add(node.module)
    assert cycles(graph) == []


def test_engine_stub_never_imports_the_cli() -> None:
    graph = import_graph(modules())
    for name in graph:
        if name.startswith("engine_stub"):
            assert not any(target.startswith("detok_worker.cli") for target in graph[name]), name


def test_engine_stub_names_no_relay_source() -> None:
    """engine_stub is the tests' gRPC engine: it serves the local sources, never detok's relays to real engines."""
    relays = {"detok_worker.engine.sources.grpc_gateway", "detok_worker.engine.sources.vllm_source"}
    graph = import_graph(modules())
    for name in graph:
        if name.startswith("engine_stub"):
            assert not graph[name] & relays, name


ENGINE_STUB_IMPORTERS = {
    "detok_worker.cli.main": "detok_worker/cli/main.py",  # `detok engine-server`
    "detok_worker.cli.trace": "detok_worker/cli/trace.py",  # `detok trace synth`: the stub's corpus
    "detok_worker.engine.sources.factory": "detok_worker/engine/sources/factory.py",  # the local engine sources
}


def test_engine_stub_is_imported_only_inside_the_commands_that_run_it() -> None:
    """The relays to real engines and the engine library (detok_worker.engine) never load engine_stub: the factory
    imports it when engine.source names a local source, and two commands when they run."""
    graph = import_graph(modules())
    importers = {n for n, targets in graph.items() if n.startswith("detok_worker") and "engine_stub" in str(targets)}
    assert importers == set(ENGINE_STUB_IMPORTERS)
    for path in ENGINE_STUB_IMPORTERS.values():
        tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
        top_level = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        assert not any("engine_stub" in ast.dump(node) for node in top_level), path


_SOURCES_WITHOUT_ENGINE_STUB = """
import sys
import detok_worker.cli.main, detok_worker.process.supervisor, detok_worker.front.server, detok_worker.worker.process
from detok_worker.engine.sources.factory import engine_run
for source in sys.argv[1:]:
    engine_run(source)
print(sorted(m for m in sys.modules if m.startswith("engine_stub")))
"""


def test_the_relays_run_without_engine_stub() -> None:
    """The modules of `detok serve` and of each relay's loop load without engine_stub; vllm in vLLM's virtualenv
    (tests/vllm_cpu)."""
    assert RELAY_SOURCES == ("grpc", "vllm")
    groups = ((sys.executable, ["grpc"]), (str(require_venv()), ["vllm"]))
    for python, sources in groups:
        result = subprocess.run(
            [python, "-c", _SOURCES_WITHOUT_ENGINE_STUB, *sources], cwd=REPO, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip().splitlines()[-1] == "[]", sources


HTTP_EDGE = "detok_worker.front.edge"


def server_internals(path: Path) -> set[str]:
    """The modules below uvicorn's and Starlette's public API that `path` imports: a private module (a name part
    with a leading underscore) or uvicorn's protocol classes."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] in ("uvicorn", "starlette") and (
                any(part.startswith("_") for part in parts) or parts[:2] == ["uvicorn", "protocols"]
            ):
                found.add(name)
    return found


def test_only_the_http_edge_reaches_below_the_servers_public_api() -> None:
    reaching = {name: found for name, path in modules().items() if (found := server_internals(path))}
    assert set(reaching) == {HTTP_EDGE}, reaching
    assert reaching[HTTP_EDGE] >= {"starlette._utils", "uvicorn.protocols.http.httptools_impl"}


def test_no_module_over_the_line_limit() -> None:
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


# A fresh interpreter per module, forked from one that has loaded only third-party packages (an import of ours
# that only works after another of ours would show; paying the third-party imports once keeps this fast).
_FORK_PER_MODULE = """
import importlib, os, sys, traceback
for package in ("msgspec", "zmq", "zmq.asyncio", "tokenizers", "tiktoken", "jinja2", "prometheus_client",
                "starlette.applications", "uvicorn", "grpc", "httpx", "numpy",
                # vLLM's environment: its big modules once, not once per module that imports them
                "vllm.engine.arg_utils", "vllm.v1.engine.core_client", "vllm.v1.metrics.loggers",
                "vllm.entrypoints.launchers.cli_args", "vllm.parser.parser_manager"):
    try:
        importlib.import_module(package)
    except ImportError:
        pass
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            sys.stderr.write(f"{name}: {traceback.format_exc()[-2000:]}\\n")
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1] != 0:
        print(name)
"""


def needs_vllm(path: Path) -> bool:
    """A module that imports vLLM at module level (the vLLM source): it runs in vLLM's own environment."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
            return True
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "vllm" for alias in node.names):
            return True
    return False


def test_every_module_imports_alone_in_a_fresh_interpreter() -> None:
    """Each module in the test environment; the ones that need vLLM in vLLM's virtualenv (tests/vllm_cpu)."""
    found = modules()
    names = [n for n in sorted(found) if not n.endswith("__main__")]
    with_vllm = [n for n in names if needs_vllm(found[n])]
    assert with_vllm == [
        "detok_worker.engine.sources.vllm_source",
        "detok_worker.engine.vllm_flags",
        "detok_worker.engine.vllm_loras",
        "detok_worker.engine.vllm_requests",
        "detok_worker.engine.vllm_stats",
        "detok_worker.engine.vllm_tool_grammar",
        "engine_stub.vllm_worker",
    ]
    for python, group in ((sys.executable, sorted(set(names) - set(with_vllm))), (str(require_venv()), with_vllm)):
        result = subprocess.run([python, "-c", _FORK_PER_MODULE, *group], cwd=REPO, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.split() == [], result.stderr[-4000:]
