"""Every shared class a guest can reach in a worker is sealed (immutable), found by a sweep.

Earlier red-team rounds found shared classes reachable and still mutable, the change
persisting across calls in the same worker: `ExceptionGroup` (a builtin), decimal's
`SignalDict` (`type(decimal.getcontext().flags)`), `enum._auto_null`
(`type(enum.auto().value)`) and `copy.Error`; the fourteenth pass two classes C modules make
as heap types, `time.struct_time` (`datetime.timetuple()`) and `_abc._abc_data` (an ABC's own
`_abc_impl`). Rather than list them, the sweep walks what
the guest is given, the way a guest would: every facade's contents and the builtins, their
public attributes, MRO bases and metaclasses, the types of values that zero-argument calls
and a set of common calls return, and the exceptions they raise. Any pure-Python class it
finds must carry the immutable flag, so a facade added later cannot bring an unsealed class
in silently. It runs in a real worker (sealing happens only in the fork server) as a plugin
with the in-interpreter layer off, the same private switch the escape corpus uses, since
the walk itself reads what the layer refuses a guest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import _sandbox as vm_sandbox_module
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._guest import PluginBundle, load_plugin

SWEEP = '''
import builtins
import sys

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm._guest import _runtime
from suaveplan_sandbox.vm._guest._policy import ALLOWED_MODULES, is_forbidden_attr
from suaveplan_sandbox.vm._guest._seal import is_prepared, is_sealed

HEAP = 1 << 9
# Names `dir()` does not list but attribute access serves (decimal's Context answers these
# from its own `__getattribute__`).
EXTRA_NAMES = ("flags", "traps")
MAX_DEPTH = 3


def roots():
    out = {"suaveplan.SuaveplanError": SuaveplanError}
    for name in [*sorted(ALLOWED_MODULES - {"suaveplan"}), "urllib"]:
        facade = _runtime.module_facade(name)
        for key, value in object.__getattribute__(facade, "_sp_content").items():
            out[name + "." + key] = value
    for key, value in _runtime._shared_builtins().items():
        out["builtins." + key] = value
    return out


def _common():
    """Values ordinary plugin code gets back from the facades (one per line, lazily)."""
    import base64, collections, csv, dataclasses, datetime, decimal, enum, fractions
    import functools, hashlib, hmac, io, itertools, json, random, re, statistics
    import textwrap, typing, urllib.parse, uuid

    @dataclasses.dataclass
    class Point:
        x: int = 0

    class Colour(enum.Flag):
        RED = enum.auto()
        BLUE = enum.auto()

    cached = functools.lru_cache(maxsize=4)(lambda x: x)
    return {
        "decimal.flags": lambda: decimal.getcontext().flags,
        "decimal.traps": lambda: decimal.getcontext().traps,
        "decimal.localcontext": lambda: decimal.localcontext(),
        "decimal.Decimal": lambda: decimal.Decimal("1.5").as_tuple(),
        "decimal.error": lambda: decimal.Decimal("x"),
        "enum.auto.value": lambda: enum.auto().value,
        "enum.Flag.members": lambda: Colour.RED | Colour.BLUE,
        "enum.Flag.missing": lambda: Colour(8),
        "re.match": lambda: re.compile("(a)(?P<n>b)?").match("ab"),
        "re.scanner": lambda: re.compile("a").scanner("aa"),
        "re.Scanner": lambda: re.Scanner([("a", lambda s, t: t)]).scan("aa"),
        "re.finditer": lambda: re.finditer("a", "aa"),
        "re.error": lambda: re.compile("("),
        "json.scanner": lambda: json.JSONDecoder().scan_once,
        "json.iterencode": lambda: json.JSONEncoder().iterencode({"a": [1]}),
        "json.error": lambda: json.loads("{"),
        "itertools.groupby": lambda: next(itertools.groupby("aab")),
        "itertools.tee": lambda: itertools.tee([1, 2]),
        "functools.lru_cache": lambda: cached,
        "functools.cache_info": lambda: cached.cache_info(),
        "functools.partial": lambda: functools.partial(max, 1),
        "functools.cmp_to_key": lambda: functools.cmp_to_key(lambda a, b: 0)(1),
        "collections.ChainMap": lambda: collections.ChainMap({}).parents,
        "collections.OrderedDict": lambda: collections.OrderedDict(a=1).items(),
        "collections.Counter": lambda: collections.Counter("aab").most_common(),
        "collections.deque": lambda: iter(collections.deque([1])),
        "collections.defaultdict": lambda: collections.defaultdict(int),
        "collections.namedtuple": lambda: collections.namedtuple("P", "a")(1),
        "collections.UserDict": lambda: collections.UserDict(a=1).data,
        "csv.reader": lambda: csv.reader(io.StringIO("a,b")),
        "csv.writer": lambda: csv.writer(io.StringIO()),
        "csv.DictReader": lambda: csv.DictReader(io.StringIO("a\\n1")),
        "csv.error": lambda: csv.reader(["a\\0"], strict=True).__next__(),
        "csv.Sniffer": lambda: csv.Sniffer().sniff("a,b\\n1,2\\n"),
        "dataclasses.field": lambda: dataclasses.fields(Point)[0],
        "dataclasses.asdict": lambda: dataclasses.asdict(Point()),
        "datetime.now": lambda: datetime.datetime.now(datetime.timezone.utc),
        "datetime.isocalendar": lambda: datetime.date(2024, 1, 1).isocalendar(),
        "datetime.timetuple": lambda: datetime.date(2024, 1, 1).timetuple(),
        "abc._abc_impl": lambda: collections.UserDict._abc_impl,
        "fractions.Fraction": lambda: fractions.Fraction(1, 3),
        "statistics.NormalDist": lambda: statistics.NormalDist(),
        "statistics.error": lambda: statistics.mean([]),
        "random.Random": lambda: random.Random(1),
        "hashlib.sha256": lambda: hashlib.sha256(),
        "hashlib.new": lambda: hashlib.new("md5"),
        "hmac.new": lambda: hmac.new(b"k", b"m", "sha256"),
        "hmac.bad_digest": lambda: hmac.new(b"k", b"m", "no-such-digest"),
        "base64.error": lambda: base64.b64decode("a"),
        "uuid.uuid4": lambda: uuid.uuid4(),
        "textwrap.TextWrapper": lambda: textwrap.TextWrapper(),
        "urllib.parse.urlsplit": lambda: urllib.parse.urlsplit("http://a/b?c#d"),
        "urllib.parse.urlparse": lambda: urllib.parse.urlparse("http://a/b?c#d"),
        "urllib.parse.bytes": lambda: urllib.parse.urlsplit(b"http://a/b"),
        "urllib.parse.defrag": lambda: urllib.parse.urldefrag("http://a#b"),
        "io.getbuffer": lambda: io.BytesIO(b"a").getbuffer(),
        "typing.List": lambda: typing.List[int],
        "typing.Union": lambda: typing.Union[int, str],
        "typing.Callable": lambda: typing.Callable[[int], int],
        "typing.Literal": lambda: typing.Literal[1],
        "typing.Annotated": lambda: typing.Annotated[int, 1],
        "typing.TypeVar": lambda: typing.TypeVar("T"),
        "typing.ParamSpec": lambda: typing.ParamSpec("P").args,
        "typing.NewType": lambda: typing.NewType("N", int),
        "typing.Optional": lambda: typing.Optional[int],
        "builtins.ExceptionGroup": lambda: ExceptionGroup("g", [ValueError()]).split(ValueError),
        "builtins.memoryview": lambda: memoryview(b"a"),
        "builtins.zip": lambda: zip(),
        "builtins.dict.keys": lambda: {}.keys(),
    }


class Sweep:
    def __init__(self):
        self.classes = {}
        self.seen = set()

    def add_class(self, cls, path):
        if id(cls) in self.classes:
            return
        self.classes[id(cls)] = (cls, path)
        for base in cls.__mro__:
            self.add_class(base, path + ".__mro__")
        self.add_class(type(cls), "type(" + path + ")")
        for name in self.names(cls):
            self.walk_attr(cls, name, path, 1)

    def names(self, obj):
        names = {n for n in dir(obj) if not n.startswith("_")}
        for klass in type(obj).__mro__:
            names.update(k for k in vars(klass) if isinstance(k, str) and not k.startswith("_"))
        # What the guest's policy refuses (`gi_frame`, `f_builtins`, ...) it cannot walk either.
        return sorted(n for n in names | set(EXTRA_NAMES) if not is_forbidden_attr(n))

    def walk_attr(self, obj, name, path, depth):
        try:
            value = getattr(obj, name)
        except BaseException as exc:  # noqa: BLE001 - what the guest would catch
            self.add_class(type(exc), "raise " + path + "." + name)
            return
        self.walk(value, path + "." + name, depth)

    def walk(self, obj, path, depth):
        if isinstance(obj, type):
            self.add_class(obj, path)
            return
        self.add_class(type(obj), "type(" + path + ")")
        if id(obj) in self.seen or depth > MAX_DEPTH:
            return
        self.seen.add(id(obj))
        if type(obj) in (tuple, list, frozenset, set):
            for i, item in enumerate(list(obj)[:64]):
                self.walk(item, path + "[" + str(i) + "]", depth + 1)
        elif type(obj) is dict or type(obj).__name__ == "mappingproxy":
            for key, value in list(obj.items())[:64]:
                self.walk(value, path + "[" + repr(key) + "]", depth + 1)
        for name in self.names(obj):
            self.walk_attr(obj, name, path, depth + 1)

    def call(self, fn, path):
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001 - what the guest would catch
            self.add_class(type(exc), "raise " + path)
            for inner in getattr(exc, "exceptions", ()):
                self.add_class(type(inner), "raise " + path + ".exceptions")
            return
        self.walk(value, path, 1)


def _unsealed():
    s = Sweep()
    start = roots()
    for path, value in start.items():
        s.walk(value, path, 0)
    for path, value in start.items():
        if callable(value):
            s.call(value, path + "()")
    for path, fn in _common().items():
        s.call(fn, path)
    found = {
        id(cls): (cls, path)
        for cls, path in s.classes.values()
        if cls.__flags__ & HEAP and not is_sealed(cls)
    }
    return len(s.classes), found


def sweep():
    if not is_prepared():
        return [0, ["the worker was not prepared"]]
    count, first = _unsealed()
    _, second = _unsealed()
    # A class made afresh by each call (csv.Sniffer's dialect, the classes `_common` defines)
    # is no one else's; one found again, the same object, persists across calls.
    unsealed = sorted(
        f"{cls.__module__}.{cls.__qualname__} <- {path}"
        for key, (cls, path) in first.items()
        if key in second
    )
    return [count, unsealed]


def exception_classes():
    """Any module's exception reaches the guest as a caught exception: all must be sealed."""
    out, todo, seen = [], [BaseException], set()
    while todo:
        for sub in type.__subclasses__(todo.pop()):
            if id(sub) not in seen:
                seen.add(id(sub))
                todo.append(sub)
                if sub.__flags__ & HEAP and not is_sealed(sub):
                    out.append(f"{sub.__module__}.{sub.__qualname__}")
    return sorted(out)
'''

GUEST = """
import datetime
import decimal
import enum
import typing


class Own(typing.Protocol):
    pass


def patch(which):
    value = {
        "ExceptionGroup": lambda: ExceptionGroup,
        "SignalDict": lambda: type(decimal.getcontext().flags),
        "auto_null": lambda: type(enum.auto().value),
        "struct_time": lambda: type(datetime.date(2024, 1, 1).timetuple()),
        "abc_data": lambda: type(Own._abc_impl),
    }[which]()
    value.derive = lambda self, excs: None
    return "patched"

"""


async def test_no_class_reachable_from_the_facades_and_builtins_is_mutable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unchecked(path: str | Path) -> PluginBundle:
        return load_plugin(path, _without_interpreter_layer=True)

    monkeypatch.setattr(vm_sandbox_module, "load_plugin", unchecked)
    (tmp_path / "plugin.py").write_text(SWEEP)
    manifest = {"name": "sweep", "permissions": {"budgets": {"wallClockMs": 20000}}}
    policy = PermissionPolicy.from_manifest(manifest, root=tmp_path)
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "plugin.py", policy=policy
    ) as sb:
        result = await sb.call("sweep")
        assert isinstance(result, list)
        count, unsealed = result
        assert unsealed == [], "\n".join(unsealed)
        assert count > 250  # the walk really reached the facades' classes
        assert await sb.call("exception_classes") == []


@pytest.mark.parametrize(
    "which", ["ExceptionGroup", "SignalDict", "auto_null", "struct_time", "abc_data"]
)
async def test_the_classes_earlier_rounds_found_mutable_are_sealed(
    tmp_path: Path, which: str
) -> None:
    (tmp_path / "plugin.py").write_text(GUEST)
    policy = PermissionPolicy.from_manifest({"name": "sealed"}, root=tmp_path)
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "plugin.py", policy=policy
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("patch", which)
        assert info.value.code == "SAND_VM_PLUGIN_ERROR"
        assert info.value.details["type"] == "TypeError"
        assert "immutable" in str(info.value.details["message"])
