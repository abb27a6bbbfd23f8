"""Property-based fuzzing of the Kineto reader: any input either loads into a valid Trace or
raises InputError — never another exception. Derandomized (the same examples on every run,
so CI is reproducible), with a deadline per example (a hang or a quadratic path fails)."""

from __future__ import annotations

import gzip
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpudiag
from gpudiag.errors import InputError
from tests.conftest import fixture

CATEGORIES = ["kernel", "Kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver",
              "cuda_sync", "cpu_op", "Operator", "user_annotation", "gpu_user_annotation",
              "python_function", "ac2g", "Trace", None, 7]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_infinity=False), st.text(max_size=8),
                    st.sampled_from(["0x0", "stream 7", "Spans", "nan", "-1"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
ARG_KEYS = ["device", "stream", "correlation", "External id", "external id", "grid", "block",
            "registers per thread", "shared memory", "bytes", "Collective name", "In msg nelems",
            "Out msg nelems", "Group size", "dtype", "Process Group Name", "cuda_sync_kind",
            "wait_on_cuda_event_id", "Device Type", "Device Id", "Addr", "Bytes",
            "Total Allocated", "Total Reserved", "Input Dims", "Input type", "name", "kind"]


@st.composite
def events(draw: st.DrawFn) -> dict[str, Any]:
    event: dict[str, Any] = {
        "ph": draw(st.sampled_from(["X", "i", "M", "s", "f", "B", None, 3])),
        "cat": draw(st.sampled_from(CATEGORIES)),
        "name": draw(st.one_of(st.sampled_from([
            "ncclKernel_AllReduce_RING_LL_Sum_float(x)", "Memcpy HtoD (Pageable -> Device)",
            "Memset (Device)", "[memory]", "ProfilerStep#3", "nccl:all_reduce", "process_name",
            "cudaLaunchKernel"]), SCALARS)),
        "pid": draw(SCALARS), "tid": draw(SCALARS), "ts": draw(SCALARS), "dur": draw(SCALARS),
    }
    if draw(st.booleans()):
        event["args"] = draw(st.one_of(
            st.dictionaries(st.sampled_from(ARG_KEYS), VALUES, max_size=6), VALUES))
    for key in draw(st.lists(st.sampled_from(list(event)), max_size=3)):
        event.pop(key, None)
    return event


@st.composite
def documents(draw: st.DrawFn) -> Any:
    body: dict[str, Any] = {"traceEvents": draw(st.lists(events(), max_size=25))}
    if draw(st.booleans()):
        body["deviceProperties"] = draw(st.lists(st.dictionaries(
            st.sampled_from(["id", "name", "numSms", "computeMajor", "computeMinor"]), VALUES,
            max_size=5), max_size=2))
    if draw(st.booleans()):
        body["distributedInfo"] = draw(st.dictionaries(st.sampled_from(["rank", "world_size"]),
                                                       SCALARS, max_size=2))
    if draw(st.booleans()):
        body["baseTimeNanoseconds"] = draw(SCALARS)
    return draw(st.one_of(st.just(body), st.just(body["traceEvents"]), VALUES))


def load_or_input_error(path: Path) -> None:
    try:
        trace = gpudiag.load(path)
    except InputError as exc:
        assert str(path) in str(exc)
        return
    trace.validate()


@settings(max_examples=250, deadline=timedelta(seconds=20), derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(doc=documents())
def test_random_kineto_shaped_documents_load_or_raise_input_error(doc: Any, tmp_path: Path) -> None:
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps(doc))
    load_or_input_error(path)


@settings(max_examples=150, deadline=timedelta(seconds=20), derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_and_truncated_real_trace_loads_or_raises_input_error(
    data: st.DataObject, tmp_path: Path
) -> None:
    raw = gzip.decompress(fixture("kineto/a100_alexnet_sync_critical_path.json.gz").read_bytes())
    cut = data.draw(st.integers(0, len(raw)))
    mutated = bytearray(raw[:cut] if data.draw(st.booleans()) else raw)
    for _ in range(data.draw(st.integers(0, 8))):
        if mutated:
            at = data.draw(st.integers(0, len(mutated) - 1))
            mutated[at] = data.draw(st.integers(0, 255))
    path = tmp_path / ("fuzz.json.gz" if data.draw(st.booleans()) else "fuzz.json")
    path.write_bytes(gzip.compress(bytes(mutated)) if path.suffix == ".gz" else bytes(mutated))
    load_or_input_error(path)
