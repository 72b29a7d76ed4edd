"""What a process compiles, counted from JAX's own monitoring events: each program handed to
XLA (its name, seconds, and whether the persistent compilation cache supplied it) and the
seconds spent tracing and lowering. A sweep prints the totals; the benchmarks and tests read
them (a warm-cache rerun compiles no train step)."""

from __future__ import annotations

import collections
import dataclasses
import threading

from jax import monitoring

_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_BACKEND = "/jax/core/compile/backend_compile_duration"  # XLA compile or a cache load
_CACHE_HIT = "/jax/compilation_cache/cache_hits"  # fired inside the backend event it answers
AHEAD_THREAD = "compile-ahead"  # the thread `scale_ablation.sweeping.ahead` compiles in


@dataclasses.dataclass(frozen=True)
class Compilation:
    name: str  # the jitted function's name (train_step, eval_step, init, ...)
    seconds: float
    from_cache: bool  # loaded from the persistent compilation cache, not compiled
    thread: str  # the compiling thread's name ("compile-ahead": `scale_ablation.sweeping.ahead`)


class CompileLog:
    """Open (`with CompileLog() as log:`) while the work to count runs; threads included."""

    def __init__(self):
        self.programs: list[Compilation] = []
        # (start, end) of each trace, lowering and XLA event per thread: traces nest (a jitted
        # function calling another), so seconds are the length of their union.
        self._spans: dict[str, list[tuple[float, float]]] = {}
        self._lock = threading.Lock()
        self._thread = threading.local()  # a cache hit seen, for this thread's backend event

    def __enter__(self) -> CompileLog:
        monitoring.register_event_listener(self._on_event)
        monitoring.register_event_duration_secs_listener(self._on_duration)
        monitoring.register_event_time_span_listener(self._on_span)
        return self

    def __exit__(self, *exc) -> None:
        monitoring.unregister_event_listener(self._on_event)
        monitoring.unregister_event_duration_listener(self._on_duration)
        monitoring.unregister_event_time_span_listener(self._on_span)

    def _on_span(self, event: str, start_time: float, end_time: float, **kwargs) -> None:
        if event in (_TRACE, _LOWER, _BACKEND):
            with self._lock:
                thread = threading.current_thread().name
                self._spans.setdefault(thread, []).append((start_time, end_time))

    def _on_event(self, event: str, **kwargs) -> None:
        if event == _CACHE_HIT:
            self._thread.hit = True

    def _on_duration(self, event: str, duration_secs: float, **kwargs) -> None:
        with self._lock:
            if event == _BACKEND:
                hit, self._thread.hit = getattr(self._thread, "hit", False), False
                name = str(kwargs.get("fun_name", "?"))  # "jit(train_step)"
                self.programs.append(Compilation(name.removeprefix("jit(").removesuffix(")"),
                                                 duration_secs, hit,
                                                 threading.current_thread().name))

    def compiled(self, prefix: str = "") -> list[Compilation]:
        """Programs XLA compiled (not loaded from the cache) whose name starts with `prefix`."""
        return [p for p in self.programs if not p.from_cache and p.name.startswith(prefix)]

    @property
    def seconds(self) -> float:
        """Wall seconds spent tracing, lowering and in XLA (compiling or loading), summed over
        threads (the compile-ahead thread's overlap the main thread's training)."""
        return self._seconds(lambda thread: True)

    @property
    def seconds_waited(self) -> float:
        """The same outside the compile-ahead thread: compilation the training waited for."""
        return self._seconds(lambda thread: thread != AHEAD_THREAD)

    def _seconds(self, counts) -> float:
        total = 0.0
        with self._lock:
            for thread, spans in self._spans.items():
                if not counts(thread):
                    continue
                end = float("-inf")
                for start, stop in sorted(spans):
                    total += max(0.0, stop - max(start, end))
                    end = max(end, stop)
        return total

    def line(self) -> str:
        loaded = sum(p.from_cache for p in self.programs)
        train_steps = self.compiled("train_step")
        ahead = sum(p.thread == AHEAD_THREAD for p in train_steps)
        return (f"compiled {len(self.compiled())} programs ({len(train_steps)} train steps, "
                f"{ahead} of them ahead), {loaded} loaded from the compilation cache, "
                f"{self.seconds:.1f} s compiling ({self.seconds_waited:.1f} s not ahead)"
                + (f"; compiled by kind: {self.kinds_line()}" if self.compiled() else ""))

    def kinds_line(self) -> str:
        """'train_step 1, eval_step 2, ...': compiled programs counted by jitted function, most
        first, so that a sweep shows which kind compiled more than once per structure."""
        counts = collections.Counter(p.name for p in self.compiled())
        return ", ".join(f"{name} {count}" for name, count in counts.most_common())
