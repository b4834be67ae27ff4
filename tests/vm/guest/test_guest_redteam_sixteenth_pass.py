"""Sixteenth red-team pass on the in-interpreter layer: the two things the fifteenth left open,
hashed keys holding a real class, and a sweep that keeps the class-computing code reviewed.

One real escape:

1. **`functools.lru_cache(typed=True)`.** A typed cache's key is the arguments, then (with
   keyword arguments) the module's private marker and the keyword items, then the real class
   of every argument: for a class argument the real `type`. A dict compares two keys element
   by element when their whole hashes are equal, so `f(C, a, b)`, key `(C, a, b, type, A,
   A)`, against `f(q, k=x)`, key `(q, marker, "k", x, Q, X)`, lines `type` up with the
   plugin's `x`, whose `__eq__` is handed it (the elements before it are the plugin's, and
   answer True). The fifteenth pass judged the hashes out of reach; both are computable:
   `hash(type)` from `hash(typing.Literal[C])` (the hash of a frozenset holding `(C, type)`,
   every step of which inverts), the marker's from its address, an `object()` the worker
   allocated next to `functools`' C functions: trying addresses near `id(functools.reduce)`,
   each try one cached call with `x`'s hash solved for, found it after ~140-220k tries, under
   a second, on 3.11-3.13, and the unguarded `type()` built a class from any namespace. The
   guest's `functools.lru_cache` now refuses `typed=True` (`SAND_VM_INDIRECT_EVAL_REJECTED`;
   `typed` is read once, as a `bool`) and the guarded `type()` no longer hands out the cache
   class, whose constructor takes `typed` directly
   (`dyncode_typed_lru_cache_key_real_type` in the escape corpus).

Other keys and tuples holding `type(x)`, probed and contained: every one lines a class up
with the class in the same place of the other key, and classes compare by identity (no
metaclass the guest reaches defines `__eq__`, swept below). typing's own typed caches
(`Literal`, `Annotated`) are never called with keyword arguments, so no marker shifts them:
with a hash collision engineered, the plugin's `__eq__` is handed its own class only.
`Literal`'s `__eq__`/`__hash__`/deduplication pair each value with its class, `(p, type(p))`;
`re`'s cache key is `(type(pattern), pattern, flags)`; `singledispatch` (not in the facade)
keys weak references to classes; `enum` and `dataclasses` key by values and names.

The regression sweep: in a real worker, every function the guest reaches through a facade
and every method of a shared class whose code (nested code included) reads `__class__` or
names `type` is either guarded by `install_method_self_guard` (public instance methods), or
out of the guest's reach as `self` (private and dunder instance methods of non-metaclasses:
the guest cannot read those names, and a protocol passes an instance), or reviewed in
`REVIEWED` below with why it hands out no metaclass. A new one in a later Python fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _redteam_support import create_plugin, create_plugin_without_the_layer, outcome

REFUSED = "SAND_VM_INDIRECT_EVAL_REJECTED"

HASHING = """
MASK = (1 << 64) - 1
P1 = 11400714785074694791
P2 = 14029467366897019727
P5 = 2870177450012600261
IP1 = pow(P1, -1, 1 << 64)
IP2 = pow(P2, -1, 1 << 64)


def signed(h):
    h &= MASK
    return h - (1 << 64) if h >> 63 else h


def step(acc, h):
    acc = (acc + (h & MASK) * P2) & MASK
    acc = ((acc << 31) | (acc >> 33)) & MASK
    return (acc * P1) & MASK


def lane(before, after):
    a = (after * IP1) & MASK
    a = ((a >> 31) | (a << 33)) & MASK
    return ((a - before) * IP2) & MASK


def unstep(after, h):
    a = (after * IP1) & MASK
    a = ((a >> 31) | (a << 33)) & MASK
    return (a - (h & MASK) * P2) & MASK


def tuple_hash(hashes):
    acc = P5
    for h in hashes:
        acc = step(acc, h)
    return signed(acc + (len(hashes) ^ (P5 ^ 3527539)))


def lane_for(hashes, index, whole):
    # The hash element `index` must have for a tuple of `hashes` to hash to `whole`.
    acc = ((whole & MASK) - (len(hashes) ^ (P5 ^ 3527539))) & MASK
    for h in reversed(hashes[index + 1 :]):
        acc = unstep(acc, h)
    before = P5
    for h in hashes[:index]:
        before = step(before, h)
    return signed(lane(before, acc))


def frozenset_member_hash(total):
    h = (((total & MASK) - 907133923) * pow(69069, -1, 1 << 64)) & MASK
    x = h
    for _ in range(64):
        x = h ^ (x >> 11) ^ (x >> 25)
    x ^= 2 * 1927868237
    t = ((x * pow(3644798167, -1, 1 << 64)) & MASK) ^ 89869747
    e = t
    for _ in range(64):
        e = (t ^ (e << 16)) & MASK
    return e


def pointer_hash(address):
    h = signed((address >> 4) | (address << 60))
    return -2 if h == -1 else h
"""

ROUTES = (
    """
import functools
import re
import typing
"""
    + HASHING
    + """

class C:
    pass


class Key:
    seen = []

    def __init__(self, h):
        self.h = h

    def __hash__(self):
        return self.h

    def __eq__(self, other):
        if not isinstance(other, Key):
            Key.seen.append(other)
        return True


def real_type_hash():
    pair = frozenset_member_hash(hash(typing.Literal[C]))
    return lane_for([hash(C), 0], 1, signed(pair))


def metaclass_seen():
    return [repr(o) for o in Key.seen if o is not C and repr(o) == "<class 'type'>"]


def typed_cache_real_type():
    Key.seen.clear()
    cached = functools.lru_cache(maxsize=None, typed=True)(lambda *a, **k: 0)
    t_hash = real_type_hash()
    cached(C, Key(11), Key(12))
    whole = tuple_hash([hash(C), 11, 12, t_hash, hash(Key), hash(Key)])
    anchor = id(functools.reduce)
    q = Key(13)
    tried = 0
    for off in range(0, 4_000_000, 16):
        for address in (anchor + off, anchor - off - 16):
            layout = [13, pointer_hash(address), hash("k"), 0, hash(Key), hash(Key)]
            cached(q, k=Key(lane_for(layout, 3, whole)))
            tried += 1
            got = [o for o in Key.seen if repr(o) == "<class 'type'>"]
            if got:
                made = got[0]("Made", (), {"x": 1})
                return [tried, repr(made), made.x]
    return ["miss", tried]


class Flip:
    answers = [False, True]

    def __bool__(self):
        return Flip.answers.pop(0) if Flip.answers else True


def typed_positional():
    return functools.lru_cache(None, True)


def typed_truthy():
    return functools.lru_cache(typed=1)


def typed_flipping_bool():
    Flip.answers = [True, False]
    return functools.lru_cache(typed=Flip())


def cache_class_by_type():
    return repr(type(functools.cache(abs)))


def cache_class_rebuilt():
    wrapper = type(functools.lru_cache(maxsize=4)(abs))
    return wrapper(abs, None, True, tuple)


def untyped_caches_keep_working():
    calls = []

    @functools.lru_cache
    def bare(x):
        calls.append(x)
        return x * 2

    @functools.lru_cache(maxsize=2, typed=False)
    def sized(x, *, k=0):
        calls.append((x, k))
        return x + k

    @functools.cache
    def whole(x):
        calls.append(x)
        return -x

    @functools.lru_cache()
    def of_classes(cls):
        calls.append(repr(cls)[-3:-2])
        return repr(cls)[-3:-2]

    Flip.answers = [False, True]
    flipped = functools.lru_cache(typed=Flip())(lambda x: x)
    out = [bare(2), bare(2), sized(1, k=2), sized(1, k=2), whole(3), whole(3)]
    out += [of_classes(C), of_classes(C), flipped(1), flipped.cache_parameters()["typed"]]
    info = bare.cache_info()
    return [out, calls, [info.hits, info.misses], sized.cache_parameters()]


def literal_cache_collision():
    # A key of typing's typed `Literal` cache holds `type` for a class value; an equal hash
    # engineered for another key still lines `type` up with a class only.
    Key.seen.clear()
    form = typing.Literal
    first = form[C]
    t_hash = real_type_hash()
    whole = tuple_hash([hash(form), hash(C), hash(type(form)), t_hash])
    x = Key(lane_for([hash(form), 0, hash(type(form)), hash(Key)], 1, whole))
    second = form[x]
    return [repr(first), second == first, sorted({repr(o) for o in Key.seen}), metaclass_seen()]


def literal_compare_and_dedup():
    Key.seen.clear()
    x = Key(hash(C))
    out = [typing.Literal[C] == typing.Literal[x], len(typing.get_args(typing.Literal[C, x]))]
    out.append(hash(typing.Literal[C, C]) == hash(typing.Literal[C]))
    return [out, metaclass_seen()]


def re_cache_with_a_class_pattern():
    Key.seen.clear()
    try:
        re.compile(C, Key(0))
    except TypeError as exc:
        err = str(exc)[:40]
    return [err, metaclass_seen()]
"""
)


async def test_a_typed_cache_key_no_longer_hands_out_the_real_type(tmp_path: Path) -> None:
    async with await create_plugin(tmp_path, ROUTES, name="redteam16") as sb:
        # Was `[~140-220k, "<class 'plugin.Made'>", 1]`: the real `type` called with three
        # arguments (3.11-3.13).
        assert await outcome(sb, "typed_cache_real_type") == REFUSED


@pytest.mark.parametrize(
    "name",
    [
        "typed_positional",
        "typed_truthy",
        "typed_flipping_bool",
        "cache_class_by_type",
        "cache_class_rebuilt",
    ],
)
async def test_no_other_way_to_a_typed_cache(tmp_path: Path, name: str) -> None:
    async with await create_plugin(tmp_path, ROUTES, name="redteam16") as sb:
        assert await outcome(sb, name) == REFUSED


async def test_untyped_caches_keep_working(tmp_path: Path) -> None:
    async with await create_plugin(tmp_path, ROUTES, name="redteam16") as sb:
        assert await sb.call("untyped_caches_keep_working") == [
            [4, 4, 3, 3, -3, -3, "C", "C", 1, False],
            [2, [1, 2], 3, "C"],
            [1, 1],
            {"maxsize": 2, "typed": False},
        ]


async def test_typing_and_re_keys_line_classes_up_with_classes(tmp_path: Path) -> None:
    async with await create_plugin(tmp_path, ROUTES, name="redteam16") as sb:
        # The collision happened (the plugin's `__eq__` ran, with its own class), and the
        # classes after it compared by identity.
        assert await sb.call("literal_cache_collision") == [
            "typing.Literal[plugin.C]",
            False,
            ["<class 'plugin.C'>"],
            [],
        ]
        assert await sb.call("literal_compare_and_dedup") == [[False, 2, True], []]
        assert await sb.call("re_cache_with_a_class_pattern") == [
            "first argument must be string or compile",
            [],
        ]


# -- the regression sweep -------------------------------------------------------------------

# Every function the guest reaches whose code computes a class and that nothing else covers,
# reviewed: `module.qualname` (a method: its class's `module.qualname.name`) -> why it hands
# out no metaclass. Union over 3.11-3.13.
REVIEWED: dict[str, str] = {
    # Module functions.
    "collections.namedtuple": "builds its own class from a fixed namespace; `__repr__` a name",
    "dataclasses.is_dataclass": "looks a name up on `type(obj)`, returns a bool",
    "enum.global_enum_repr": "the class's module name, formatted into a string",
    "enum.global_flag_repr": "the class's module and name, formatted into a string",
    "enum.global_str": "the class's name, formatted into a string",
    "json.loads": "the argument's class name in an error message",
    "typing.is_protocol": "`isinstance(tp, type)`, a bool (3.13)",
    "typing.no_type_check": "`isinstance(.., type)` tests; returns its argument",
    "typing.reveal_type": "the class name, printed to stderr (3.11 names it in code)",
    # Class and static methods, metaclass methods: `cls`/`self` is a class by design.
    "enum.Enum.__new__": "`type(value) is cls`, a comparison",
    "enum.EnumType.__contains__": "class names in an error message (3.11)",
    "enum.EnumType.__new__": "`type(_gnv) is not staticmethod`; `type(e)` of a raised error",
    "fractions.Fraction.__new__": "`type(x) is int` comparisons",
    "fractions.Fraction.from_decimal": "the argument's class name in an error message",
    "fractions.Fraction.from_float": "the argument's class name in an error message",
    "typing.Generic.__init_subclass__": "`type(cls) != _TypedDictMeta`, a comparison (3.11)",
    "typing.NamedTupleMeta.__new__": "`type(val).__set_name__` of a body value (3.13): no "
    "metaclass the guest reaches has one",
    "typing.Protocol.__init_subclass__": "`isinstance(other, type)` in its hook (3.11)",
    "typing._TypedDictMeta.__new__": "`type(base) is not _TypedDictMeta`; `type.__new__` of "
    "its own metaclass",
}

SWEEP = """
import types

from suaveplan_sandbox.vm._guest import _runtime
from suaveplan_sandbox.vm._guest._guards import _namedtuple_api
from suaveplan_sandbox.vm._guest._policy import ALLOWED_MODULES
from suaveplan_sandbox.vm._guest._seal import is_prepared, shared_classes

OWN = "suaveplan_sandbox"
GUARD = _runtime._on_instances_only(lambda self: None).__code__


def _dunder(name):
    return len(name) > 4 and name[:2] == name[-2:] == "__"


def _functions(value):
    # (function, how it is bound: "instance", "class" or "static")
    if type(value) is classmethod:
        value, kind = value.__func__, "class"
    elif type(value) is staticmethod:
        value, kind = value.__func__, "static"
    else:
        kind = "instance"
    if type(value) is types.FunctionType:
        return [(value, kind)]
    if type(value) is property:
        parts = (value.fget, value.fset, value.fdel)
        return [(f, "instance") for f in parts if type(f) is types.FunctionType]
    return []


def _module_functions():
    out = set()
    for name in [*sorted(ALLOWED_MODULES - {"suaveplan"}), "urllib.parse"]:
        facade = _runtime.module_facade(name)
        for value in object.__getattribute__(facade, "_sp_content").values():
            for f, _ in _functions(value):
                if f.__module__.split(".")[0] != OWN and _runtime._computes_a_class(f.__code__):
                    out.add(f.__module__ + "." + f.__qualname__)
    return out


def _methods(classes):
    unguarded, reviewable = set(), set()
    for cls in classes:
        meta = issubclass(cls, type)
        for name, value in vars(cls).items():
            if type(name) is not str:
                continue
            for f, kind in _functions(value):
                code = f.__code__
                if code is GUARD or not _runtime._computes_a_class(code):
                    continue
                label = cls.__module__ + "." + cls.__qualname__ + "." + name
                if name.startswith("_") and not _dunder(name) and not _namedtuple_api(cls, name):
                    continue  # private: the guest cannot read a trusted class's own
                if kind != "instance" or meta:
                    reviewable.add(label)
                elif not name.startswith("_"):
                    unguarded.add(label)
                # else: a dunder instance method of a non-metaclass; the guest cannot read
                # it off the class, and a protocol passes an instance.
    return unguarded, reviewable


def sweep():
    if not is_prepared():
        return ["the worker was not prepared"]
    shared = [c for c in shared_classes() if c.__module__.split(".")[0] != OWN]
    unguarded, reviewable = _methods(shared)
    metas_with_eq = sorted(
        c.__module__ + "." + c.__qualname__
        for c in shared
        if issubclass(c, type) and not {"__eq__", "__ne__", "__hash__"}.isdisjoint(vars(c))
    )
    return [
        sorted(unguarded),
        sorted(reviewable | _module_functions()),
        metas_with_eq,
        len(shared),
    ]
"""


async def test_every_class_computing_function_is_guarded_or_reviewed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the layer off: the walk reads code objects.
    async with await create_plugin_without_the_layer(
        tmp_path, monkeypatch, SWEEP, name="sweep16"
    ) as sb:
        result = await sb.call("sweep")
    assert isinstance(result, list)
    unguarded, found, metas_with_eq, count = result
    assert unguarded == []  # public instance methods: `install_method_self_guard`
    assert [f for f in found if f not in REVIEWED] == []
    assert metas_with_eq == []  # classes in keys compare by identity
    assert count > 250
