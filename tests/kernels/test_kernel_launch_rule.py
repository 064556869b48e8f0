"""The launch rule of cuda/src/kernels/launch.cuh, read from the source: every __global__ under cuda/src begins
with await_producers(); (release_consumers(); may follow, and every kernel calls it), and no <<<>>> launch is
left (every kernel goes through launch(), which asks for programmatic dependent launch)."""

from __future__ import annotations

import re
from pathlib import Path

CUDA_SOURCE = Path(__file__).resolve().parents[2] / "cuda" / "src"

_QUALIFIER = r"(?:[A-Za-z_]\w*::)*"
# A kernel's constant weights may be asked into L2 before the wait (launch.cuh): those calls, then the wait.
_AWAIT_FIRST = re.compile(r"(?:" + _QUALIFIER + r"prefetch_constant_rows\s*\([^;]*\)\s*;\s*)*" + _QUALIFIER +
                          r"await_producers\s*\(\s*\)\s*;")
_RELEASE = re.compile(r"\b" + _QUALIFIER + r"release_consumers\s*\(\s*\)\s*;")
_IDENTIFIER_BEFORE = re.compile(r"([A-Za-z_]\w*)\s*$")


def blank_comments_and_literals(text: str) -> str:
    """`text` with comments, string and character literals replaced by spaces (newlines kept), so a brace, a
    `<<<` or a call named inside them is never read as code."""
    out = list(text)
    i, n = 0, len(text)

    def blank(start: int, end: int) -> None:
        for j in range(start, min(end, n)):
            if out[j] != "\n":
                out[j] = " "

    while i < n:
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
        elif text[i] == '"' or (text[i] == "'" and not (i > 0 and text[i - 1].isalnum())):  # 1'000: digits
            end = i + 1
            while end < n and text[end] != text[i]:
                end += 2 if text[end] == "\\" else 1
            end += 1
        else:
            i += 1
            continue
        blank(i, end)
        i = end
    return "".join(out)


def _close(code: str, start: int, opening: str, closing: str) -> int:
    """Index just past the bracket that closes the one at `start`."""
    depth = 0
    for i in range(start, len(code)):
        if code[i] == opening:
            depth += 1
        elif code[i] == closing:
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError(f"unbalanced {opening}{closing} from offset {start}")


def kernels(code: str) -> list[tuple[str, str]]:
    """(name, body) of every __global__ definition in blanked `code`; declarations (ending in `;`) are skipped."""
    found = []
    for match in re.finditer(r"\b__global__\b", code):
        i, last_params = match.end(), None
        while i < len(code) and code[i] not in "{;":
            if code[i] == "(":
                last_params = i
                i = _close(code, i, "(", ")")
            else:
                i += 1
        if i >= len(code) or code[i] == ";" or last_params is None:
            continue
        name = _IDENTIFIER_BEFORE.search(code[match.end():last_params])
        found.append((name.group(1) if name else "?", code[i + 1:_close(code, i, "{", "}") - 1]))
    return found


def rule_breaches(text: str, where: str) -> list[str]:
    """What in the source `text` (named `where`) breaks the launch rule, one line each."""
    code = blank_comments_and_literals(text)
    breaches = []
    for name, body in kernels(code):
        if not _AWAIT_FIRST.match(body.lstrip()):
            breaches.append(f"{where}: kernel {name} does not begin with await_producers();")
        if not _RELEASE.search(body):
            breaches.append(f"{where}: kernel {name} never calls release_consumers();")
    for match in re.finditer(r"<<<", code):
        line = code.count("\n", 0, match.start()) + 1
        breaches.append(f"{where}:{line}: a <<<>>> launch (use launch() of kernels/launch.cuh)")
    return breaches


def _sources() -> list[Path]:
    return sorted(p for p in CUDA_SOURCE.rglob("*") if p.suffix in (".cu", ".cuh"))


def test_every_kernel_follows_the_launch_rule():
    breaches, count = [], 0
    for path in _sources():
        text = path.read_text()
        count += len(kernels(blank_comments_and_literals(text)))
        breaches += rule_breaches(text, str(path.relative_to(CUDA_SOURCE)))
    assert count >= 50, f"the parser found only {count} kernels under cuda/src: it no longer reads them"
    assert not breaches, "\n".join(breaches)


GOOD = """
template <int R, bool kFull>
__global__ void __launch_bounds__(kThreads * 2, 1) walk_kernel(Shape shape, Args args) {
  // the first statement: a comment before it does not count
  kernels::await_producers();
  release_consumers();
  if (threadIdx.x >= shape.n) return;
  args.out[threadIdx.x] = 1.0f;
}
__global__ void declared_only(int n);
constexpr long long kTimeoutNs = 1'000'000'000;  // digit separators are not character literals
// a comment naming k<<<1, 1>>>() and __global__ void f() { x[0] = 0; } is not code
const char* text = "k<<<1, 1>>>() { }";
__global__ void tiny(int* seen) { await_producers(); release_consumers(); seen[0] = '}'; }
__global__ void weighed(const float* w, int rows) {
  prefetch_constant_rows(w, 4 * sizeof(float), static_cast<long>(blockIdx.x) * 4, 4, rows);
  await_producers();
  release_consumers();
}
"""


def test_the_checker_passes_a_kernel_that_keeps_the_rule():
    assert [name for name, _ in kernels(blank_comments_and_literals(GOOD))] == ["walk_kernel", "tiny", "weighed"]
    assert rule_breaches(GOOD, "good.cu") == []


def test_the_checker_names_each_breach():
    missing = "__global__ void k(float* x) { x[0] = 1.0f; }"
    after_return = ("__global__ void __launch_bounds__(32) late(int n, float* x) {\n"
                    "  if (threadIdx.x >= n) return;\n  await_producers();\n  release_consumers();\n}")
    commented = "__global__ void c(float* x) { // await_producers();\n  release_consumers();\n  x[0] = 0; }"
    released_first = "__global__ void r(float* x) { release_consumers(); await_producers(); x[0] = 0; }"
    never_released = "__global__ void q(float* x) { await_producers(); x[0] = 0; }"
    read_first = "__global__ void p(float* x) { prefetch_constant_rows(x, 4, 0, 1, 1); x[0] = 0; await_producers(); }"
    chevrons = "cudaError_t f(cudaStream_t s) {\n  k<<<1, 32, 0, s>>>(x);\n  return cudaGetLastError();\n}"
    assert rule_breaches(missing, "a.cu") == ["a.cu: kernel k does not begin with await_producers();",
                                              "a.cu: kernel k never calls release_consumers();"]
    assert rule_breaches(after_return, "b.cu") == ["b.cu: kernel late does not begin with await_producers();"]
    assert rule_breaches(commented, "c.cu") == ["c.cu: kernel c does not begin with await_producers();"]
    assert rule_breaches(released_first, "d.cu") == ["d.cu: kernel r does not begin with await_producers();"]
    assert rule_breaches(never_released, "e.cu") == ["e.cu: kernel q never calls release_consumers();"]
    assert rule_breaches(read_first, "g.cu")[0] == "g.cu: kernel p does not begin with await_producers();"
    assert rule_breaches(chevrons, "f.cu") == ["f.cu:2: a <<<>>> launch (use launch() of kernels/launch.cuh)"]
