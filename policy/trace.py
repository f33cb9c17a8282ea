"""Reading clusters and workloads: the openb CSV files and a generic YAML/JSON format.

openb (Alibaba cluster-trace-gpu-v2023, used by the FGD paper):

- node list: ``sn,cpu_milli,memory_mib,gpu,model``
- pod list, full layout: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,
  creation_time,deletion_time,scheduled_time``; short layout (multigpu traces): the first five.
  ``gpu_spec`` is empty (any model) or models joined by ``|``.

Generic format (``.yaml``, ``.yml`` or ``.json``; documented in docs/trace-format.md)::

    nodes:
      - name: gpu-a            # with count: N, names get -0 .. -(N-1)
        cpu: "96"              # Kubernetes quantities: "96", "500m"
        memory: 384Gi
        gpus: 8
        gpuModel: V100M32
        labels: {zone: a}
        count: 4
    pods:
      - name: train
        cpu: 8
        memory: 32Gi
        gpus: 1                # whole cards, or 1 with gpuMilli < 1000 for a share of one card
        gpuMilli: 500
        gpuModels: [V100M16, V100M32]
        creationTime: 0        # seconds; optional, for the event-driven simulator
        deletionTime: 3600

Every malformed row or field stops loading with a :class:`TraceError` naming the file, the line,
the column or field, and what was expected; no row is silently dropped.

The openb files are the user's own download, never part of the repository: commands that default to
them find them in the folder named by ``$RLSCHED_OPENB_DIR`` (:func:`openb_file`, :func:`openb_default`).
"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import yaml

from .cluster import NodeSpec, PodSpec, memory_limit_text, pod_request_problem
from .resources import (
    MEMORY_MIB_LIMIT,
    MILLI_PER_CARD,
    QUANTITY_LIMIT,
    QuantityError,
    QuantityTooLarge,
    clip,
    count,
    cpu_milli,
    memory_mib,
)

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS_SHORT = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_COLUMNS_OPTIONAL = ("gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")
MAX_COUNT = 1_000_000
"""``count:`` of one generic entry at most this (a typo of a few digits must not fill the memory)."""
MAX_CARDS_PER_NODE = 256
"""GPU cards of one node at most this: the extender's bound (``rlsched.extender.objects.MAX_CARDS_PER_NODE``,
the same number), so a file the simulator accepts describes a node the extender could serve. The cluster
state holds a column per card slot and inflation adds pods until the cards are covered, so a typo of a
few digits (``gpu: 80000000``) must not reach them."""
NODE_MEMORY_MIB_MOST = MEMORY_MIB_LIMIT - 1
"""A node's memory at most this many MiB: its bytes below 2**53, as the extender reads a node
(:data:`~rlsched.policy.resources.MEMORY_MIB_LIMIT`). The scorers count memory in bytes in int64, so a
larger node (the int64 type holds up to 8 EiB) would overflow them."""
POD_MEMORY_MIB_MOST = MEMORY_MIB_LIMIT
"""A pod's memory request at most this many MiB: the extender's saturated request (more than any node
holds), which the decision log records and ``rlsched train --from-decisions`` writes back as a trace."""
MAX_NESTING = 64
"""Generic files nest at most this deep (the format needs 4 levels; PyYAML composes recursively)."""
_log = logging.getLogger(__name__)
_QOS = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,31}", re.ASCII)
_INT = re.compile(r"-?[0-9]{1,40}", re.ASCII)
"""openb integer cells: ASCII digits only (``int()`` would take "１０" and "1_0"), short enough to convert cheaply."""


class TraceError(ValueError):
    """A trace file that cannot be read; the message says where and what was expected."""

    def __init__(self, path: str | Path, line: int | None, where: str | None, message: str):
        self.path, self.line, self.where = str(path), line, where
        location = self.path + (f":{line}" if line else "")
        field = f": {where}" if where else ""
        super().__init__(f"{location}{field}: {message}")


@dataclass(frozen=True)
class Trace:
    """A cluster and a workload loaded from files."""

    nodes: tuple[NodeSpec, ...]
    pods: tuple[PodSpec, ...]


# -- where the openb files are ---------------------------------------------------------------------

OPENB_ENV = "RLSCHED_OPENB_DIR"
"""Environment variable naming the folder of the openb CSV files (cluster-trace-gpu-v2023's ``csv/``):
where every command's openb default (``--nodes``, ``--pods``, ``--data``) points."""
OPENB_NODES = "openb_node_list_gpu_node.csv"
"""The openb node list (1,213 GPU nodes)."""
OPENB_PODS = "openb_pod_list_default.csv"
"""The openb default pod list."""
_OPENB_FOLDER = "the folder of the openb CSV files (cluster-trace-gpu-v2023/csv)"


def openb_dir() -> Path | None:
    """The folder ``$RLSCHED_OPENB_DIR`` names; None when the variable is unset or empty."""
    configured = os.environ.get(OPENB_ENV, "")
    return Path(configured).expanduser() if configured else None


def openb_file(name: str) -> str:
    """Default path of the openb file ``name``: inside ``$RLSCHED_OPENB_DIR``, or the bare name when the
    variable is unset (a command then reports the file missing: :func:`missing_input`)."""
    folder = openb_dir()
    return str(folder / name) if folder else name


def openb_default(given: str | None, flag: str, name: str = "") -> str:
    """A command's openb input: ``given`` (the flag's value) when set, else ``name`` inside
    ``$RLSCHED_OPENB_DIR`` (the folder itself without a name). ValueError, naming the flag and the
    variable, when neither is there."""
    if given:
        return given
    folder = openb_dir()
    if folder is None:
        raise ValueError(
            f"{flag} not given and {OPENB_ENV} not set: give {flag}, or set {OPENB_ENV} to {_OPENB_FOLDER}"
        )
    return str(folder / name) if name else str(folder)


def missing_input(path: str | Path, flag: str) -> str:
    """What to say about an input file that is not there: ``no such file`` (or, for a folder, that it is
    one), and for an openb default left bare (``$RLSCHED_OPENB_DIR`` unset, :func:`openb_file`) the flag
    and the variable that name it."""
    if Path(path).is_dir():
        return f"{flag} {path}: is a folder; give a file"
    message = f"no such file: {path}"
    if openb_dir() is None and str(path) in (OPENB_NODES, OPENB_PODS):
        message += f"; give {flag} FILE, or set {OPENB_ENV} to {_OPENB_FOLDER}"
    return message


def output_problem(path: str | Path, flag: str, folder: bool = False) -> str | None:
    """Why a command could not write ``path`` (a file, or with ``folder`` a folder it creates), or None.

    Commands check their outputs before the work: a run of minutes or hours must not end in a traceback
    because ``--json`` names a folder or ``--out`` a file. The check is the path itself (not the
    other kind of thing where it exists) and its nearest existing ancestor (a folder this process may
    write to); the write itself is still guarded, since the filesystem can change meanwhile."""
    target = Path(path)
    if str(path) == "":
        return f"{flag}: an empty path"
    if target.exists():
        if folder and not target.is_dir():
            return f"{flag} {path}: is a file, not a folder"
        if not folder and target.is_dir():
            return f"{flag} {path}: is a folder; give a file path"
        if not os.access(target, os.W_OK):
            return f"{flag} {path}: not writable"
        return None
    parent = target.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{flag} {path}: {parent} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{flag} {path}: cannot create it in {parent} (not writable)"
    return None


# -- openb CSV -------------------------------------------------------------------------------------


def _first_undecodable_line(path: Path) -> int | None:
    """The 1-based line of the first byte sequence that is not UTF-8, or None. The text reader decodes
    the file in blocks of several KiB, so its error cannot say which line the bad byte is on; this
    second pass, run only after such an error, can."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    # splitlines: a lone CR ends a line too, as for the csv and YAML readers (Excel's "CSV (Macintosh)")
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return number
    return None


def _not_utf8(path: Path, exc: UnicodeDecodeError) -> TraceError:
    """A TraceError for a file that is not UTF-8 text, at the line of its first bad byte."""
    bad = exc.object[exc.start : exc.start + 1]
    return TraceError(
        path, _first_undecodable_line(path), None, f"not UTF-8 text (byte {bad!r}); save the file as UTF-8"
    )


def _csv_rows(path: Path, required: Sequence[str], known: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        # utf-8-sig: a byte-order mark (what spreadsheet programs put first) is not part of the first column's name.
        handle = path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(path, None, None, f"cannot open: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise TraceError(
                path, 1, None, f"empty file; expected a header line with columns {','.join(required)}"
            ) from None
        except UnicodeDecodeError as exc:
            raise _not_utf8(path, exc) from None
        except csv.Error as exc:
            raise TraceError(path, 1, None, f"not a CSV file: {exc}") from exc
        header = [h.strip() for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(
                path,
                1,
                None,
                f"header lacks column(s) {', '.join(missing)}; expected {','.join(required)}"
                f" (optional: {','.join(c for c in known if c not in required) or 'none'}), got {','.join(header)}",
            )
        dupes = sorted({h for h in header if header.count(h) > 1})
        if dupes:
            raise TraceError(path, 1, None, f"column(s) {', '.join(dupes)} appear twice in the header")
        _warn_unknown_columns(path, header, known)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except UnicodeDecodeError as exc:
                raise _not_utf8(path, exc) from None
            except csv.Error as exc:
                raise TraceError(path, reader.line_num, None, f"unreadable row: {exc}") from exc
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                raise TraceError(path, line, None, "empty row; remove it or fill in every column")
            if len(row) != len(header):
                raise TraceError(path, line, None, f"has {len(row)} fields, the header has {len(header)}")
            yield line, {h: cell.strip() for h, cell in zip(header, row, strict=True)}


def _warn_unknown_columns(path: Path, header: Sequence[str], known: Sequence[str]) -> None:
    """Log a warning naming header columns the reader does not know. They are ignored, as documented
    (an export may carry more columns), but a misspelt optional column (``gpuspec`` for ``gpu_spec``)
    would otherwise drop its constraint silently."""
    unknown = [clip(h) for h in header if h not in known]
    if unknown:
        _log.warning(
            "warning: %s:1: column(s) %s not known, ignored (known: %s)",
            path,
            ", ".join(unknown[:10]) + (", …" if len(unknown) > 10 else ""),
            ",".join(known),
        )


@overload
def _int_field(
    path: Path,
    line: int,
    row: dict[str, str],
    column: str,
    what: str,
    optional: Literal[False] = False,
    most: int | None = None,
) -> int: ...


@overload
def _int_field(
    path: Path, line: int, row: dict[str, str], column: str, what: str, optional: bool, most: int | None = None
) -> int | None: ...


def _int_field(
    path: Path, line: int, row: dict[str, str], column: str, what: str, optional: bool = False, most: int | None = None
) -> int | None:
    """The cell as a non-negative integer below 2**53, or at most ``most`` MiB of memory when given."""
    text = row.get(column, "")
    if text == "" and optional:
        return None
    if not _INT.fullmatch(text):
        raise TraceError(
            path, line, f"column '{column}'", f"expected a non-negative integer ({what}), got {clip(text)}"
        )
    value = int(text)
    if value < 0:
        raise TraceError(path, line, f"column '{column}'", f"expected a non-negative integer ({what}), got {value}")
    if most is not None and value > most:
        problem = f"{value} MiB is unreasonably large ({memory_limit_text(most)})"
        raise TraceError(path, line, f"column '{column}'", problem)
    if value >= QUANTITY_LIMIT:
        raise TraceError(path, line, f"column '{column}'", f"{value} is unreasonably large ({what}; at most 2**53 - 1)")
    return value


def read_openb_nodes(path: str | Path) -> list[NodeSpec]:
    """Read an openb node list (``sn,cpu_milli,memory_mib,gpu,model``)."""
    path = Path(path)
    nodes: list[NodeSpec] = []
    seen: dict[str, int] = {}
    for line, row in _csv_rows(path, NODE_COLUMNS, NODE_COLUMNS):
        name = row["sn"]
        if not name:
            raise TraceError(path, line, "column 'sn'", "expected a node name, got an empty field")
        if name in seen:
            raise TraceError(path, line, "column 'sn'", f"node {clip(name)} already defined on line {seen[name]}")
        seen[name] = line
        cpu = _int_field(path, line, row, "cpu_milli", "millicores")
        mem = _int_field(path, line, row, "memory_mib", "MiB", most=NODE_MEMORY_MIB_MOST)
        gpus = _int_field(path, line, row, "gpu", "number of GPU cards")
        if gpus > MAX_CARDS_PER_NODE:
            raise TraceError(path, line, "column 'gpu'", _too_many_cards(gpus))
        model = row["model"]
        if gpus and not model:
            raise TraceError(path, line, "column 'model'", f"node has {gpus} GPUs, so a GPU model name is expected")
        if not gpus and model:
            raise TraceError(
                path,
                line,
                "column 'gpu'",
                f"model is {clip(model)} but gpu is 0; give the number of cards or clear the model",
            )
        nodes.append(NodeSpec(name, cpu, mem, gpus, model))
    if not nodes:
        raise TraceError(path, None, None, "no nodes: the file has a header but no rows")
    return nodes


def read_openb_pods(path: str | Path) -> list[PodSpec]:
    """Read an openb pod list (full or short column layout)."""
    path = Path(path)
    pods: list[PodSpec] = []
    seen: dict[str, int] = {}
    for line, row in _csv_rows(path, POD_COLUMNS_SHORT, POD_COLUMNS_SHORT + POD_COLUMNS_OPTIONAL):
        name = row["name"]
        if not name:
            raise TraceError(path, line, "column 'name'", "expected a pod name, got an empty field")
        if name in seen:
            raise TraceError(path, line, "column 'name'", f"pod {clip(name)} already defined on line {seen[name]}")
        seen[name] = line
        cpu = _int_field(path, line, row, "cpu_milli", "millicores")
        mem = _int_field(path, line, row, "memory_mib", "MiB", most=POD_MEMORY_MIB_MOST)
        num_gpu = _int_field(path, line, row, "num_gpu", "whole GPUs, or 1 for a share of a card")
        gpu_milli = _int_field(path, line, row, "gpu_milli", f"milli per card, 1..{MILLI_PER_CARD}")
        problem = pod_request_problem(cpu, mem, num_gpu, gpu_milli)
        if problem:
            raise TraceError(path, line, "columns 'num_gpu', 'gpu_milli'", problem)
        spec = row.get("gpu_spec", "")
        models = tuple(m.strip() for m in spec.split("|")) if spec else ()
        if any(not m for m in models):
            raise TraceError(
                path,
                line,
                "column 'gpu_spec'",
                f"expected GPU models joined by '|' (e.g. V100M16|V100M32), got {clip(spec)}",
            )
        created = _int_field(path, line, row, "creation_time", "seconds", optional=True)
        deleted = _int_field(path, line, row, "deletion_time", "seconds", optional=True)
        if created is not None and deleted is not None and deleted < created:
            raise TraceError(
                path, line, "column 'deletion_time'", f"deletion_time {deleted} is before creation_time {created}"
            )
        qos = row.get("qos", "").strip()
        if qos and not _QOS.fullmatch(qos):
            raise TraceError(path, line, "column 'qos'", f"expected a QoS class such as LS or BE, got {clip(qos)}")
        pods.append(PodSpec(name, cpu, mem, num_gpu, gpu_milli, models, created, deleted, qos))
    if not pods:
        raise TraceError(path, None, None, "no pods: the file has a header but no rows")
    return pods


def _too_many_cards(gpus: int) -> str:
    return f"{gpus} GPU cards on one node; at most {MAX_CARDS_PER_NODE} are supported (as in the extender)"


# -- generic YAML / JSON ---------------------------------------------------------------------------


class _Refused(yaml.YAMLError):
    """YAML that parses but a trace file may not use: aliases, too deep a nesting."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line, self.message = line, message


class _TraceLoader(yaml.SafeLoader):
    """SafeLoader's composer without aliases and with a nesting limit.

    An alias (``*a``) repeats a node, so a few hundred bytes of nested aliases ("billion laughs") expand
    to gigabytes when the document is converted; trace files have no use for them. Nesting is bounded
    because composing (and converting) recurses once per level."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise _Refused(
                event.start_mark.line + 1,
                f"alias *{str(event.anchor)[:32]}: aliases are not supported in trace files; write the value out "
                "(or use count: N for copies)",
            )
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise _Refused(event.start_mark.line + 1, f"nested more than {MAX_NESTING} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Doc:
    """A parsed YAML/JSON document with the source line of every mapping and its keys."""

    def __init__(self, path: Path):
        self.path = path
        self.lines: dict[int, dict[str, int]] = {}
        try:
            text = path.read_text(encoding="utf-8-sig")
        except OSError as exc:
            raise TraceError(path, None, None, f"cannot open: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise _not_utf8(path, exc) from None
        try:
            node = yaml.compose(text, Loader=_TraceLoader)
        except _Refused as exc:
            raise TraceError(path, exc.line, None, exc.message) from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise TraceError(
                path, mark.line + 1 if mark else None, None, f"not valid YAML/JSON: {getattr(exc, 'problem', exc)}"
            ) from exc
        self._loader = yaml.SafeLoader("")
        try:
            self.root = self._convert(node) if node is not None else None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise TraceError(
                path, mark.line + 1 if mark else None, None, f"not valid YAML/JSON: {getattr(exc, 'problem', exc)}"
            ) from exc
        finally:
            self._loader.dispose()
        self.root_line = node.start_mark.line + 1 if node is not None else 1

    def _convert(self, node: yaml.Node) -> Any:
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            keys: dict[str, int] = {}
            for key_node, value_node in node.value:
                key = str(key_node.value)
                line = key_node.start_mark.line + 1
                if key in keys:  # YAML and JSON loaders keep the last silently: a second list would replace the first
                    raise TraceError(
                        self.path,
                        line,
                        f"key {clip(key)}",
                        f"repeated key (first on line {keys[key]}); give each key once",
                    )
                out[key] = self._convert(value_node)
                keys[key] = line
            keys["<self>"] = node.start_mark.line + 1
            self.lines[id(out)] = keys
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self._convert(v) for v in node.value]
        try:
            return self._loader.construct_object(node)
        except ValueError as exc:  # e.g. an integer beyond Python's 4300-digit conversion limit
            raise TraceError(
                self.path,
                node.start_mark.line + 1,
                None,
                f"unreadable value ({exc.__class__.__name__}): {clip(str(node.value))}",
            ) from None

    def line_of(self, mapping: dict[str, Any], key: str | None = None) -> int | None:
        keys = self.lines.get(id(mapping), {})
        return keys.get(key) if key and key in keys else keys.get("<self>")


_NODE_FIELDS = {"name", "cpu", "memory", "gpus", "gpuModel", "labels", "count"}
_POD_FIELDS = {"name", "cpu", "memory", "gpus", "gpuMilli", "gpuModels", "creationTime", "deletionTime", "count"}


def _expand(
    doc: _Doc, section: str, fields: set[str], build: Callable[[dict[str, Any], str, Callable[..., Any]], Any]
) -> list[Any]:
    root = doc.root
    if root is None:
        return []
    if not isinstance(root, dict):
        raise TraceError(doc.path, doc.root_line, None, "expected a mapping with 'nodes:' and/or 'pods:' lists")
    items = root.get(section)
    if items is None:
        return []
    if not isinstance(items, list):
        raise TraceError(doc.path, doc.line_of(root, section), section, f"expected a list of {section}")
    out = []
    seen: dict[str, str] = {}
    for i, item in enumerate(items):
        where = f"{section}[{i}]"
        if not isinstance(item, dict):
            raise TraceError(doc.path, doc.line_of(root, section), where, "expected a mapping of fields")
        unknown = sorted(set(item) - fields)
        if unknown:
            raise TraceError(
                doc.path,
                doc.line_of(item, unknown[0]),
                f"{where}.{unknown[0]}",
                f"unknown field; known fields: {', '.join(sorted(fields))}",
            )

        def fail(key: str, message: str, item: dict[str, Any] = item, where: str = where) -> TraceError:
            return TraceError(doc.path, doc.line_of(item, key), f"{where}.{key}", message)

        n = item.get("count", 1)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise fail("count", f"expected a positive integer, got {clip(n)}")
        if n > MAX_COUNT:
            raise fail("count", f"{clip(n)} is more than {MAX_COUNT:,} copies; split the entry or use an openb CSV")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise fail("name", "expected a non-empty string")
        for j in range(n):
            full = name if n == 1 else f"{name}-{j}"
            if full in seen:
                raise fail(
                    "name",
                    f"name {clip(full)} is used twice "
                    f"(first by {seen[full]}; with count: N, names get -0..-N-1 suffixes)",
                )
            seen[full] = where
            out.append(build(item, full, fail))
    return out


def _quantity(
    item: dict[str, Any],
    key: str,
    convert: Callable[..., Any],
    fail: Callable[..., Any],
    default: Any = None,
    what: str = "",
) -> Any:
    if key not in item:
        if default is None:
            raise fail(key, f"required field missing ({what})")
        return default
    try:
        value = convert(item[key])
    except QuantityError as exc:
        raise fail(key, f"{exc} ({what})") from None
    if value < 0:
        raise fail(key, f"must not be negative ({what})")
    return value


def _memory_mib(value: Any, most: int) -> int:
    """A memory quantity of at most ``most`` MiB (:data:`NODE_MEMORY_MIB_MOST`, :data:`POD_MEMORY_MIB_MOST`)."""
    try:
        mib = _memory_mib_unbounded(value)
    except QuantityTooLarge:
        mib = None
    if mib is None or mib > most:
        raise QuantityTooLarge(f"{clip(value)} is unreasonably large ({memory_limit_text(most)})")
    return mib


def _node_memory_mib(value: Any) -> int:
    return _memory_mib(value, NODE_MEMORY_MIB_MOST)


def _pod_memory_mib(value: Any) -> int:
    return _memory_mib(value, POD_MEMORY_MIB_MOST)


def _memory_mib_unbounded(value: Any) -> int:
    """A memory quantity; a value without a unit — an integer, a float, or a string that ends in a digit or
    a point (``16384``, ``"16384"``, ``2048.0``, ``4e5``) — means MiB, and must be a whole number of them
    (``1.5`` is refused rather than rounded). A value with a unit (``32Gi``, ``500M``) is converted."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return memory_mib(value)  # refused by the parser with its message
    if isinstance(value, str) and not (value and value[-1] in "0123456789."):
        return memory_mib(value)
    try:
        return count(value)  # huge ints are refused by the parser without being turned into text
    except QuantityError as exc:
        if "whole number" in str(exc):
            raise QuantityError(
                f"{clip(value)} has no unit, so it means MiB, and must be a whole number of MiB; "
                f"give a unit for other sizes (e.g. '1536Ki')"
            ) from None
        raise


def _generic_node(item: dict[str, Any], name: str, fail: Callable[..., Any]) -> NodeSpec:
    cpu = _quantity(item, "cpu", cpu_milli, fail, what="cores, e.g. '64' or '500m'")
    mem = _quantity(
        item,
        "memory",
        _node_memory_mib,
        fail,
        what="bytes with a unit, e.g. '256Gi'; a number without a unit means MiB",
    )
    gpus = _quantity(item, "gpus", count, fail, default=0, what="number of GPU cards")
    if gpus > MAX_CARDS_PER_NODE:
        raise fail("gpus", _too_many_cards(gpus))
    model = item.get("gpuModel", "")
    if not isinstance(model, str):
        raise fail("gpuModel", "expected a string such as 'V100M32'")
    if gpus and not model:
        raise fail("gpuModel", f"node has {gpus} GPUs, so a GPU model name is expected")
    labels = item.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(k, str) for k in labels):
        raise fail("labels", "expected a mapping of string keys to values")
    return NodeSpec(name, cpu, mem, gpus, model, {k: str(v) for k, v in labels.items()})


def _generic_pod(item: dict[str, Any], name: str, fail: Callable[..., Any]) -> PodSpec:
    cpu = _quantity(item, "cpu", cpu_milli, fail, default=0, what="cores, e.g. '8' or '500m'")
    mem = _quantity(
        item,
        "memory",
        _pod_memory_mib,
        fail,
        default=0,
        what="bytes with a unit, e.g. '32Gi'; a number without a unit means MiB",
    )
    gpus = _quantity(item, "gpus", count, fail, default=0, what="whole GPU cards, or 1 with gpuMilli for a share")
    milli = item.get("gpuMilli", MILLI_PER_CARD if gpus else 0)
    if not isinstance(milli, int) or isinstance(milli, bool) or milli.bit_length() > 64:
        raise fail("gpuMilli", f"expected an integer 1..{MILLI_PER_CARD}, got {clip(milli)}")
    problem = pod_request_problem(cpu, mem, gpus, milli)
    if problem:
        raise fail("gpuMilli" if "gpuMilli" in item else "gpus", problem)
    models = item.get("gpuModels", [])
    if isinstance(models, str):
        models = [m.strip() for m in models.split("|")]  # "T4 | G2", as CSV gpu_spec is read
    if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
        raise fail("gpuModels", "expected a list of GPU model names (or one string joined by '|')")
    times = []
    for key in ("creationTime", "deletionTime"):
        value = item.get(key)
        if value is not None and (
            not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < QUANTITY_LIMIT
        ):
            raise fail(key, f"expected non-negative seconds, got {clip(value)}")
        times.append(value)
    if times[0] is not None and times[1] is not None and times[1] < times[0]:
        raise fail("deletionTime", "is before creationTime")
    return PodSpec(name, cpu, mem, gpus, milli, tuple(models), times[0], times[1])


def read_generic(path: str | Path) -> Trace:
    """Read a generic YAML/JSON cluster and/or workload file."""
    path = Path(path)
    doc = _Doc(path)
    nodes = _expand(doc, "nodes", _NODE_FIELDS, _generic_node)
    pods = _expand(doc, "pods", _POD_FIELDS, _generic_pod)
    if isinstance(doc.root, dict):
        unknown = sorted(set(doc.root) - {"nodes", "pods", "apiVersion", "kind"})
        if unknown:
            raise TraceError(
                path,
                doc.line_of(doc.root, unknown[0]),
                unknown[0],
                "unknown top-level key; expected 'nodes' and/or 'pods'",
            )
    return Trace(tuple(nodes), tuple(pods))


# -- dispatch --------------------------------------------------------------------------------------


def _is_generic(path: Path) -> bool:
    return path.suffix.lower() in (".yaml", ".yml", ".json")


def load_nodes(path: str | Path) -> list[NodeSpec]:
    """Nodes from an openb node CSV or a generic YAML/JSON file."""
    path = Path(path)
    if _is_generic(path):
        nodes = list(read_generic(path).nodes)
        if not nodes:
            raise TraceError(path, None, "nodes", "no nodes defined; add a 'nodes:' list")
        return nodes
    return read_openb_nodes(path)


def load_pods(path: str | Path) -> list[PodSpec]:
    """Pods from an openb pod CSV or a generic YAML/JSON file."""
    path = Path(path)
    if _is_generic(path):
        pods = list(read_generic(path).pods)
        if not pods:
            raise TraceError(path, None, "pods", "no pods defined; add a 'pods:' list")
        return pods
    return read_openb_pods(path)


def dump_generic(nodes: Sequence[NodeSpec], pods: Sequence[PodSpec]) -> str:
    """Write a cluster and workload in the generic format (JSON, which is also YAML)."""
    doc = {
        "nodes": [
            {
                "name": n.name,
                "cpu": f"{n.cpu_milli}m",
                "memory": f"{n.memory_mib}Mi",
                "gpus": n.gpu_count,
                **({"gpuModel": n.gpu_model} if n.gpu_model else {}),
                **({"labels": dict(n.labels)} if n.labels else {}),
            }
            for n in nodes
        ],
        "pods": [
            {
                "name": p.name,
                "cpu": f"{p.cpu_milli}m",
                "memory": f"{p.memory_mib}Mi",
                "gpus": p.num_gpu,
                **({"gpuMilli": p.gpu_milli} if p.num_gpu else {}),
                **({"gpuModels": list(p.gpu_models)} if p.gpu_models else {}),
                **({"creationTime": p.creation_time} if p.creation_time is not None else {}),
                **({"deletionTime": p.deletion_time} if p.deletion_time is not None else {}),
            }
            for p in pods
        ],
    }
    return json.dumps(doc, indent=1)
