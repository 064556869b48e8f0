# The expert cache's replacement policy (strata/expert_policy.hpp), also on its own over a routing trace.
from libcpp.memory cimport unique_ptr
from libcpp.vector cimport vector

from strata.libstrata.expert_policy cimport CppReplacementPolicy, ExpertMove, PolicyOptions


cdef PolicyOptions policy_options(dict policy) except *:
    """The native replacement options from {"replace", "admit_after", "window", "max_copies"} (missing keys keep
    the native defaults: no replacement)."""
    unknown = sorted(policy.keys() - {"replace", "admit_after", "window", "max_copies"})
    if unknown:
        raise InvalidArgument(f"expert cache policy: unknown {', '.join(unknown)} (replace, admit_after, window, "
                              "max_copies)")
    cdef PolicyOptions o
    o.replace = policy.get("replace", o.replace)
    o.admit_after = policy.get("admit_after", o.admit_after)
    o.window = policy.get("window", o.window)
    o.max_copies = policy.get("max_copies", o.max_copies)
    return o


cdef class ReplacementPolicy:
    """The expert cache's replacement alone (strata/expert_policy.hpp), on the host: what a routing trace makes
    the cache hold. plan() returns the moves [(layer, slot, expert, evicted)] a token's end begins."""
    cdef unique_ptr[CppReplacementPolicy] policy

    def __cinit__(self, list slots, int n_expert, dict policy):
        cdef vector[int] counts = slots
        self.policy.reset(new CppReplacementPolicy(counts, n_expert, policy_options(policy)))

    def hold(self, int layer, experts) -> None:
        cdef vector[int] ids = [int(e) for e in experts]
        self.policy.get().hold(layer, ids)

    def note(self, int layer, ids) -> int:
        cdef const int32_t[::1] view = np.ascontiguousarray(ids, dtype=np.int32)
        return self.policy.get().note(layer, &view[0], view.shape[0]) if view.shape[0] else 0

    def plan(self) -> list:
        return [(m.layer, m.slot, m.expert, m.evicted) for m in self.policy.get().plan()]

    def complete(self, tuple move) -> None:
        cdef ExpertMove m
        m.layer, m.slot, m.expert, m.evicted = move
        self.policy.get().complete(m)

    def slot_of(self, int layer, int expert) -> int:
        return self.policy.get().slot_of(layer, expert)
