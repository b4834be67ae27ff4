"""Red-team pass on the in-interpreter layer, from the guest's side.

Each refused route was a working escape (or a guard bypass) before its fix; the escape
corpus (`tests/security/escapes/`) carries the full attacks. Here each route is asserted to
fail closed with its SAND_VM_* code, and the ordinary code next to it to keep working.
These run in real workers: the stdlib guards and sealing exist only in a prepared worker.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox
from suaveplan_sandbox.vm._guest import GuestRuntime, compile_bundle, load_plugin

FORBIDDEN = "SAND_VM_ATTRIBUTE_FORBIDDEN"
INDIRECT = "SAND_VM_INDIRECT_EVAL_REJECTED"
FROZEN = "SAND_VM_GLOBALS_FROZEN"

ATTACKS = """
import collections
import dataclasses
import enum
import typing
import urllib.parse
import hashlib

from suaveplan import fs

U = "_" * 2
GLOBALS = U + "globals" + U
CLASS_FIELD = "{0." + U + "class" + U + "}"


def _same(x):
    return x


def _ref(text="__import__"):
    return typing.get_args(typing.List[text])[0]


class Any(typing.Callable):
    def __subclasshook__(c=None, *a):
        return True


def forwardref_evaluate():
    return repr(_ref()._evaluate({}, {}, recursive_guard=frozenset()))


def forwardref_evaluate_getattr():
    return repr(getattr(_ref(), "_evaluate"))


def enum_convert():
    return repr(enum.Enum._convert_("Probe", "os", lambda n: n == "getpid"))


def private_of_a_shared_class():
    return repr(enum.Enum._missing_)


def private_inherited_from_a_foreign_class():
    class Mine(enum.IntEnum):
        A = 1

    return repr(Mine._convert_)


def private_store_on_a_foreign_object():
    ref = _ref()
    ref._evaluate = None
    return "stored"


def generic_alias_forwarding():
    alias = type(list[int])

    class Forward(alias):
        pass

    return repr(Forward(_ref(), (int,))._evaluate)


def own_method_called_with_a_foreign_self():
    class Pure:
        def peek(self):
            return self._evaluate

    return repr(Pure.peek(_ref()))


def getattr_with_a_str_subclass_name():
    class Name(str):
        def startswith(self, *args):
            return False

        def lstrip(self, *args):
            return "x"

    return sorted(getattr(fs.read_text, Name(GLOBALS)))[:3]


def setattr_with_a_str_subclass_name():
    class Name(str):
        def startswith(self, *args):
            return False

    class Mine:
        pass

    setattr(Mine, Name(U + "match_args" + U), (GLOBALS,))
    return "set"


def _names(_fn):
    return (GLOBALS,)


def decorated_dunder_def_as_match_args():
    class Probe(typing.Callable):
        @_names
        def __match_args__(self):
            pass

        def __subclasshook__(c=None, *a):
            return True

    match fs.read_text:
        case Probe(g):
            return sorted(g)[:3]
    return "no match"


def staticmethod_of_a_tuple_as_match_args():
    class Probe:
        @staticmethod
        @_names
        def __match_args__():
            pass

    return "defined"


def copy_reconstruct_sets_match_args():
    class Payload:
        def __reduce_ex__(self, proto):
            return (_same, (Any,), (None, {U + "match_args" + U: (GLOBALS,)}))

    @dataclasses.dataclass
    class Box:
        v: object

    dataclasses.asdict(Box(Payload()))
    return "copied"


def copy_reconstruct_sets_a_foreign_private():
    class Payload:
        def __reduce_ex__(self, proto):
            return (_ref, (), (None, {"_evaluate": 1}))

    @dataclasses.dataclass
    class Box:
        v: object

    dataclasses.asdict(Box(Payload()))
    return "copied"


def dataclass_field_renamed_into_exec():
    @dataclasses.dataclass
    class Base:
        x: int = 0

    dataclasses.fields(Base)[0].name = "x) or print('injected') or (self"

    @dataclasses.dataclass(init=False, repr=False)
    class Child(Base):
        pass

    return Child() == Child()


def dataclass_field_renamed_to_a_dunder():
    @dataclasses.dataclass
    class Point:
        x: int = 0

    dataclasses.fields(Point)[0].name = U + "class" + U
    return repr(dataclasses.asdict(Point()))


def typeddict_keys_as_dataclass_fields():
    keys = typing.TypedDict("Keys", {"x) or print('injected') or (self": int})
    return repr(dataclasses.dataclass(keys))


def dataclass_default_is_a_foreign_private():
    class Base:
        def _hidden(self):
            return 1

    Base = dataclasses.dataclass(Base)
    return repr(Base)


def dataclass_default_is_str_format():
    @dataclasses.dataclass
    class Text(str):
        format: int

    return dataclasses.fields(Text)[0].default(CLASS_FIELD, 1)


def dataclass_subclass_resolves_a_field_to_str_format():
    @dataclasses.dataclass(init=False)
    class Fields:
        format: int

    class Text(str, Fields):
        pass

    return dataclasses.asdict(Text("x"))["format"](CLASS_FIELD, 1)


def inherited_match_args_on_an_abc():
    Named = collections.namedtuple("Named", "format")

    class Probe(Named, typing.Callable):
        pass

    return "defined"


def enum_functional_dunder_member():
    return repr(enum.Enum("E", [(U + "match_args" + U, ("format",)), ("A", 1)]))


def enum_functional_str_subclass_member():
    class Name(str):
        pass

    return repr(enum.Enum("E", [(Name("A"), 1)]))


def real_type_from_get_origin():
    real = typing.get_origin(typing.Type)
    return repr(real("X", (), {U + "match_args" + U: (GLOBALS,)}))


def metaclass_through_typing_type():
    class Meta(typing.Type):
        pass

    return "defined"


def metaclasses_left_the_facades():
    out = []
    for module, name in ((typing, "ABCMeta"), (typing, "NamedTupleMeta"), (enum, "EnumType"),
                         (enum, "EnumMeta")):
        out.append(hasattr(module, name))
    return out


def str_format_of_a_str_subclass():
    class Text(str):
        pass

    return Text.format(CLASS_FIELD, 1)


def str_format_through_super():
    class Text(str):
        def render(self):
            return super().format(1)

    return Text(CLASS_FIELD).render()


def register_on_a_shared_abc():
    class Fake:
        pass

    typing.Mapping.register(Fake)
    return "registered"


def register_on_own_abc():
    class Mine(typing.Callable):
        pass

    class Other:
        pass

    Mine.register(Other)
    return isinstance(Other(), Mine)


def shared_containers_are_read_only():
    out = []
    for attempt in (
        lambda: urllib.parse.uses_netloc.append("evil"),
        lambda: hashlib.algorithms_available.add("evil"),
        lambda: typing.EXCLUDED_ATTRIBUTES.append("evil"),
    ):
        try:
            attempt()
            out.append("mutated")
        except AttributeError:
            out.append("read-only")
    return out


def get_origin_of_type_is_the_guarded_type():
    return [typing.get_origin(typing.Type) is type, typing.get_args(typing.Type[int]) == (int,)]


def attribute_error_obj_of_an_alias_origin():
    try:
        typing.Type.nope
    except AttributeError as e:
        return repr(e.obj)


def attribute_error_obj_through_getattr():
    try:
        typing.Type.nope
    except AttributeError as e:
        return repr(getattr(e, "obj"))


def user_string_format_reads_a_dunder():
    return collections.UserString(CLASS_FIELD).format(1)


def user_string_format_map_reads_a_dunder():
    template = "{x." + U + "class" + U + "}"
    return collections.UserString(template).format_map({"x": 1})


class _Maker(collections.namedtuple("_Base", "a")):
    def __new__(cls, *args):
        return type(_ref())


def class_statement_yielding_a_foreign_class():
    anchor = _Maker._make([1])

    class Adopted(anchor):
        pass

    return repr(_ref()._evaluate({}, {}, recursive_guard=frozenset()))


def class_statement_yielding_a_non_class():
    class Holder(collections.namedtuple("_Other", "name bases namespace")):
        pass

    class Made(Holder._make([1, 2, 3])):
        x = 1

    return [Made.name, len(Made.bases), Made.namespace["x"]]


def typing_context_manager_origin_is_sealed():
    alias = getattr(typing, "ContextManager", None)  # not listed by 3.13's typing
    if alias is None:
        return "sealed"
    try:
        typing.get_origin(alias).gen = property(len)
    except TypeError:
        return "sealed"
    return "mutated"


def raise_generator_exit():
    raise GeneratorExit()


def raise_keyboard_interrupt():
    raise KeyboardInterrupt()


def alive():
    return "alive"
"""

REFUSED = {
    "forwardref_evaluate": FORBIDDEN,
    "forwardref_evaluate_getattr": FORBIDDEN,
    "enum_convert": FORBIDDEN,
    "private_of_a_shared_class": FORBIDDEN,
    "private_inherited_from_a_foreign_class": FORBIDDEN,
    "private_store_on_a_foreign_object": FORBIDDEN,
    "generic_alias_forwarding": FORBIDDEN,
    "own_method_called_with_a_foreign_self": FORBIDDEN,
    "getattr_with_a_str_subclass_name": FORBIDDEN,
    "setattr_with_a_str_subclass_name": FORBIDDEN,
    "decorated_dunder_def_as_match_args": FORBIDDEN,
    "staticmethod_of_a_tuple_as_match_args": FORBIDDEN,
    "copy_reconstruct_sets_match_args": FORBIDDEN,
    "copy_reconstruct_sets_a_foreign_private": FORBIDDEN,
    "dataclass_field_renamed_into_exec": FORBIDDEN,
    "dataclass_field_renamed_to_a_dunder": FORBIDDEN,
    "typeddict_keys_as_dataclass_fields": FORBIDDEN,
    "dataclass_default_is_a_foreign_private": "ok-or-forbidden",
    "dataclass_default_is_str_format": FORBIDDEN,
    "dataclass_subclass_resolves_a_field_to_str_format": FORBIDDEN,
    "inherited_match_args_on_an_abc": FORBIDDEN,
    "enum_functional_dunder_member": FORBIDDEN,
    "enum_functional_str_subclass_member": FORBIDDEN,
    "real_type_from_get_origin": INDIRECT,
    "metaclass_through_typing_type": INDIRECT,
    "register_on_a_shared_abc": FROZEN,
    "attribute_error_obj_of_an_alias_origin": FORBIDDEN,
    "attribute_error_obj_through_getattr": FORBIDDEN,
    "user_string_format_reads_a_dunder": FORBIDDEN,
    "user_string_format_map_reads_a_dunder": FORBIDDEN,
    "class_statement_yielding_a_foreign_class": INDIRECT,
}


async def _create(tmp_path: Path, source: str) -> VmSandbox:
    (tmp_path / "plugin.py").write_text(source)
    policy = PermissionPolicy.from_manifest({"name": "redteam"}, root=tmp_path)
    return await create_vm_sandbox(plugin_module_path=tmp_path / "plugin.py", policy=policy)


@pytest.fixture
async def attacks(tmp_path: Path) -> AsyncIterator[VmSandbox]:
    sb = await _create(tmp_path, ATTACKS)
    try:
        yield sb
    finally:
        await sb.dispose()


async def _outcome(sb: VmSandbox, name: str) -> object:
    try:
        return ("ok", await sb.call(name))
    except SuaveplanError as err:
        return err.code


async def test_every_route_fails_closed_with_its_code(attacks: VmSandbox) -> None:
    got = {name: await _outcome(attacks, name) for name in REFUSED}
    want = dict(REFUSED)
    # A plain method named like a private one is the plugin's own: decorating it is fine.
    assert got.pop("dataclass_default_is_a_foreign_private") == (
        "ok",
        "<class 'plugin.dataclass_default_is_a_foreign_private.<locals>.Base'>",
    )
    want.pop("dataclass_default_is_a_foreign_private")
    assert got == want


async def test_the_guarded_facades_still_answer(attacks: VmSandbox) -> None:
    assert await attacks.call("metaclasses_left_the_facades") == [False, False, False, False]
    assert await attacks.call("shared_containers_are_read_only") == ["read-only"] * 3
    assert await attacks.call("get_origin_of_type_is_the_guarded_type") == [True, True]
    assert await attacks.call("register_on_own_abc") is True
    assert await attacks.call("typing_context_manager_origin_is_sealed") == "sealed"
    # A first base that is not a class makes its type the "metaclass": what that returns
    # may stand, as long as it is not a class (only a class made from the body is one).
    assert await attacks.call("class_statement_yielding_a_non_class") == ["Made", 1, 1]


@pytest.mark.parametrize("name", ["str_format_of_a_str_subclass", "str_format_through_super"])
async def test_str_format_reached_through_a_subclass_stays_guarded(
    attacks: VmSandbox, name: str
) -> None:
    assert await _outcome(attacks, name) == FORBIDDEN


@pytest.mark.parametrize(
    ("name", "kind"),
    [("raise_generator_exit", "GeneratorExit"), ("raise_keyboard_interrupt", "KeyboardInterrupt")],
)
async def test_a_base_exception_is_a_plugin_error_and_the_worker_lives_on(
    attacks: VmSandbox, name: str, kind: str
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await attacks.call(name)
    assert info.value.code == "SAND_VM_PLUGIN_ERROR"
    assert info.value.details["type"] == kind
    assert await attacks.call("alive") == "alive"


IDIOMS = """
import dataclasses
import enum
import functools
import io
import json
import random
import typing
import urllib.parse


class Planet(enum.Enum):
    EARTH = (1, 2)

    def __init__(self, a, b):
        self._extra = b   # runs while the Enum class is still being built


class Colour(enum.Enum):
    RED = 1

    @classmethod
    def _missing_(cls, value):
        return cls._value2member_map_.get(1)


class Registry:
    def __init_subclass__(cls):
        cls._registered = True   # the new class is being built, yet the plugin's


class Entry(Registry):
    pass


@dataclasses.dataclass
class Config:
    name: str
    _cache: dict = dataclasses.field(default_factory=dict, repr=False)
    format: str = "csv"


@dataclasses.dataclass(frozen=True, slots=True)
class Slotted:
    _x: int

    def double(self):
        return self._x * 2


class Buffer(io.StringIO):
    _count = 0

    def add(self, text):
        self._count += 1
        self.write(text)
        return self._count


class Rng(random.Random):
    _draws = 0

    def draw(self):
        self._draws += 1
        return self.random()


class Lazy:
    @functools.cached_property
    def _value(self):
        return 41

    def value(self):
        return self._value + 1


class Failure(Exception):
    def __init__(self, code):
        self._code = code


class Base:
    def _helper(self):
        return "base"


class Derived(Base):
    def call(self):
        return super()._helper()


@typing.runtime_checkable
class HasArea(typing.Protocol):
    def area(self): ...


class Square:
    def area(self):
        return 4


class Point(typing.NamedTuple):
    x: int
    y: int = 0


def counted(fn):
    fn._calls = 0
    return fn


@counted
def ticked():
    return 1


def run():
    url = urllib.parse.urlsplit("https://a.test/p?q=1")._replace(query="")
    config = Config("n")
    config._cache["k"] = 1
    buffer = Buffer()
    buffer.add("x")
    rng = Rng(1)
    rng.draw()
    ticked._calls += 1
    try:
        raise Failure(7)
    except Failure as err:
        code = err._code
    match config:
        case Config(name=name):
            matched = name
    return [
        urllib.parse.urlunsplit(url),
        Planet.EARTH._extra,
        Colour(9).name,
        Entry._registered,
        dataclasses.asdict(config),
        Slotted(2).double(),
        buffer.add("y"),
        buffer.getvalue(),
        rng._draws,
        Lazy().value(),
        code,
        Derived().call(),
        isinstance(Square(), HasArea),
        Point(1)._replace(y=3)._asdict(),
        list(Point._fields),
        ticked._calls,
        matched,
        json.dumps(dataclasses.astuple(config)),
        "{0.name}".format(config),
    ]
"""


async def test_ordinary_private_attribute_idioms_keep_working(tmp_path: Path) -> None:
    sb = await _create(tmp_path, IDIOMS)
    try:
        assert await sb.call("run") == [
            "https://a.test/p",
            2,
            "RED",
            True,
            {"name": "n", "_cache": {"k": 1}, "format": "csv"},
            4,
            2,
            "xy",
            1,
            42,
            7,
            "base",
            True,
            {"x": 1, "y": 3},
            ["x", "y"],
            1,
            "n",
            json.dumps(["n", {"k": 1}, "csv"]),
            "n",
        ]
    finally:
        await sb.dispose()


OBJ_IDIOMS = """
import collections
import dataclasses


@dataclasses.dataclass
class Wrapped:
    obj: object
    n: int = 0


class Holder:
    def __init__(self, obj):
        self.obj = obj

    def get(self):
        return self.obj


def tagged():
    return 1


tagged.obj = "t"


def run():
    match Wrapped("w", 2):
        case Wrapped(o, n):
            matched = [o, n]
    holder = Holder(3)
    setattr(holder, "obj", 4)
    return [
        matched,
        holder.get(),
        getattr(holder, "obj"),
        tagged.obj,
        dataclasses.asdict(Wrapped(5)),
        collections.UserString("{0}-{x}").format(1, x=2),
        collections.UserString("{x}").format_map({"x": 3}),
    ]
"""


async def test_the_plugins_own_obj_attributes_and_user_string_format_keep_working(
    tmp_path: Path,
) -> None:
    sb = await _create(tmp_path, OBJ_IDIOMS)
    try:
        assert await sb.call("run") == [
            ["w", 2],
            4,
            4,
            "t",
            {"obj": 5, "n": 0},
            "1-2",
            "3",
        ]
    finally:
        await sb.dispose()


# -- load time ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        "    match x:\n        case int(_secret=s):\n            return s\n",
        "    match x:\n        case str(format=f):\n            return f\n",
        "    match x:\n        case str(format_map=f):\n            return f\n",
        "    match x:\n        case mod._Hidden():\n            return 1\n",
        "    match x:\n        case mod._VALUE:\n            return 1\n",
        "    match x:\n        case mod.format:\n            return 1\n",
        "    match x:\n        case AttributeError(obj=o):\n            return o\n",
    ],
)
def test_patterns_naming_private_or_formatting_attributes_are_refused_at_load(
    tmp_path: Path, body: str
) -> None:
    (tmp_path / "p.py").write_text("import json as mod\ndef f(x):\n" + body)
    with pytest.raises(SuaveplanError) as info:
        load_plugin(tmp_path / "p.py")
    assert info.value.code == FORBIDDEN
    assert info.value.details["line"] == 4


# -- the `self._x` shortcut, in-process (no sealing needed) ---------------------------------


def _runtime(tmp_path: Path, source: str) -> GuestRuntime:
    (tmp_path / "plugin.py").write_text(source)
    rt = GuestRuntime(
        compile_bundle(load_plugin(tmp_path / "plugin.py")),
        host_call=lambda *a: None,
        log=lambda *a: None,
    )
    rt.start()
    return rt


SHORTCUT = """
import typing


class Pure:
    def __init__(self):
        self._x = 1

    def read(self, other):
        return self._x + other._x

    def peek(self):
        return self._evaluate

    def rebinding(self, other):
        self = other
        return self._evaluate

    def closure(self):
        return [self._x for _ in range(2)]


def ok():
    return [Pure().read(Pure()), Pure().closure()]


def foreign_self():
    return repr(Pure.peek(typing.get_args(typing.List["x"])[0]))


def foreign_other():
    return Pure().read(typing.get_args(typing.List["x"])[0])


def rebound_self():
    return repr(Pure().rebinding(typing.get_args(typing.List["x"])[0]))
"""


def test_the_self_shortcut_serves_the_plugins_own_objects_only(tmp_path: Path) -> None:
    rt = _runtime(tmp_path, SHORTCUT)
    assert rt.call("ok", [], {}) == [2, [1, 1]]
    for name in ("foreign_self", "foreign_other", "rebound_self"):
        with pytest.raises(SuaveplanError) as info:
            rt.call(name, [], {})
        assert info.value.code == FORBIDDEN, name


def test_the_self_shortcut_is_compiled_only_where_self_is_never_rebound(tmp_path: Path) -> None:
    import ast

    from suaveplan_sandbox.vm._guest._policy import check_module

    tree, _ = check_module(SHORTCUT, "plugin.py")
    methods = {
        n.name: ast.unparse(n)
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and n.args.args and n.args.args[0].arg == "self"
    }
    assert "__sp_self__ = __sp_pure_self__(self)" in methods["read"]
    assert "(self if __sp_self__ else __sp_private__(self, '_x', False))" in methods["read"]
    # `other._x` is always checked; a function that rebinds `self` keeps every check.
    assert "__sp_private__(other, '_x', False)" in methods["read"]
    assert "__sp_self__" not in methods["rebinding"]


def test_host_never_sees_the_worker_guards() -> None:
    # The stdlib guards patch classes and are installed only in a prepared worker.
    field = dataclasses.field()
    field.name = "x"
    field.name = "y"
    assert field.name == "y"


# -- enum.property's member redirect (3.12+) ---------------------------------------------------

ENUM_PROPERTY = """
import enum

from suaveplan import fs

U = "_" * 2


def _redirect(kind, name):
    class Redirect(enum.property):
        _attr_type = kind
        _cls_type = fs.read_text

    probe = Redirect()

    class Holder:
        x = probe

        def __init__(self):
            self._value_ = fs.read_text

    probe.name = name
    return Holder().x


def reads(kind, name):
    return repr(_redirect(kind, name))[:60]


class Title(str, enum.Enum):
    title = "shout"
    other = "quiet"


def legit_redirects():
    method = Title.title.title  # 3.12+: str's method through the redirect; 3.11: the member
    return [method() if callable(method) else method.value, Title("quiet").name]
"""


@pytest.mark.parametrize(
    ("kind", "name"),
    [("attr", "__globals__"), ("desc", "__globals__"), ("attr", "_x"), ("desc", "format")],
)
async def test_an_enum_property_redirect_reads_only_what_getattr_may(
    tmp_path: Path, kind: str, name: str
) -> None:
    async with await _create(tmp_path, ENUM_PROPERTY) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("reads", kind, name)
        if sys.version_info >= (3, 12):
            assert info.value.code == FORBIDDEN
        else:  # 3.11's enum.property looks up `_member_map_` only
            assert info.value.details["type"] == "AttributeError"


async def test_enum_member_redirects_over_a_mixins_methods_keep_working(tmp_path: Path) -> None:
    async with await _create(tmp_path, ENUM_PROPERTY) as sb:
        titled = "Shout" if sys.version_info >= (3, 12) else "shout"
        assert await sb.call("legit_redirects") == [titled, "other"]


# Fourth pass: a plugin's subclass (or a public attribute it sets) makes a trusted
# standard-library method use a name or value it did not check.
SUBCLASS_ROUTES = """
import collections
import dataclasses
import functools
import io
import random

U = "_" * 2
FIELDS = U + "dataclass_fields" + U


def lying_field_subclass():
    class LyingField(dataclasses.Field):
        def get_name(self):
            return self.real

        def set_name(self, value):
            self.real = value

        name = property(get_name, set_name)

    field = LyingField(dataclasses.MISSING, 0, True, True, None, True, None, False)

    @dataclasses.dataclass
    class Victim:
        x: int = field

    return "made"


def cached_property_dunder_name():
    class Holder:
        stash = functools.cached_property(lambda self: {})

    Holder.stash.attrname = FIELDS
    return repr(Holder().stash)


def cached_property_foreign_private_name():
    class Gen(random.Random):
        stash = functools.cached_property(lambda self: (lambda n: 0))

    Gen.stash.attrname = "_randbelow"
    return repr(Gen(1).stash)


@dataclasses.dataclass
class Box:
    v: object


class Smuggle:
    def __init__(self, target, state):
        self.target = target
        self.state = state

    def __reduce_ex__(self, proto):
        target = self.target
        return (lambda: target, (), self.state)


def setstate_of_an_exception_sets_a_dunder():
    @dataclasses.dataclass
    class Err(Exception):
        pass

    dataclasses.asdict(Box(Smuggle(Err(), {FIELDS: {}})))
    return "set"


def setstate_of_a_stringio_sets_a_dunder():
    dataclasses.asdict(Box(Smuggle(io.StringIO(), ("", "\\n", 0, {FIELDS: {}}))))
    return "set"


class Err(Exception):
    def __init__(self, msg):
        self.args = (msg,)
        self._why = "why"


class Gen(random.Random):
    pass


class Text(io.StringIO):
    pass


class Lazy:
    @functools.cached_property
    def _base(self):
        return 41

    @functools.cached_property
    def total(self):
        return self._base + 1


@dataclasses.dataclass
class Row:
    name: str = dataclasses.field(default="n")
    tags: list = dataclasses.field(default_factory=list)


def legit():
    text = Text("abc")
    text.tag = "t"
    copied = dataclasses.asdict(
        Box([Err("m"), Gen(5), text, functools.partial(max, 1), collections.UserDict(a=1)])
    )["v"]
    err, gen, text2, part, user = copied
    return [
        err._why,
        str(err),
        gen.random() == Gen(5).random(),
        text2.getvalue(),
        text2.tag,
        part(5),
        dict(user),
        Lazy().total,
        dataclasses.asdict(Row(tags=[1])),
    ]
"""


@pytest.mark.parametrize(
    "name",
    [
        "lying_field_subclass",
        "cached_property_dunder_name",
        "cached_property_foreign_private_name",
        "setstate_of_an_exception_sets_a_dunder",
        "setstate_of_a_stringio_sets_a_dunder",
    ],
)
async def test_trusted_methods_refuse_what_a_plugin_subclass_or_attribute_chose(
    tmp_path: Path, name: str
) -> None:
    async with await _create(tmp_path, SUBCLASS_ROUTES) as sb:
        assert await _outcome(sb, name) == FORBIDDEN


async def test_fields_cached_properties_and_copies_of_plugin_objects_keep_working(
    tmp_path: Path,
) -> None:
    async with await _create(tmp_path, SUBCLASS_ROUTES) as sb:
        assert await sb.call("legit") == [
            "why",
            "m",
            True,
            "abc",
            "t",
            5,
            {"a": 1},
            42,
            {"name": "n", "tags": [1]},
        ]


SUBCLASSHOOK_ROUTES = """
import typing

from suaveplan import fs

seen = []


class Probe(typing.Hashable):
    @classmethod
    def __subclasshook__(cls, c):
        seen.append(c)
        return True


class Plain(typing.Sized):
    def __subclasshook__(c=None, *a):
        return True


@typing.runtime_checkable
class Named(typing.Protocol):
    def name(self): ...


class HasName:
    def name(self):
        return "n"


def hook_sees_only_what_type_hands_out():
    seen.clear()
    checks = [
        isinstance(int, Probe),
        isinstance(fs.read_text, Probe),
        isinstance(Probe, Probe),
        isinstance(fs.read_text, Plain),
    ]
    return [checks, [repr(c) for c in seen]]


def legit():
    seen.clear()
    return [
        isinstance(3, Probe),
        issubclass(str, Probe),
        [repr(c) for c in seen],
        isinstance(object(), Plain),
        isinstance(HasName(), Named),
        isinstance(3, Named),
    ]
"""


async def test_an_abc_subclasshook_never_sees_a_class_type_refuses(tmp_path: Path) -> None:
    async with await _create(tmp_path, SUBCLASSHOOK_ROUTES) as sb:
        got = await sb.call("hook_sees_only_what_type_hands_out")
        assert got == [[False, False, False, False], []]
        assert await sb.call("legit") == [
            True,
            True,
            ["<class 'int'>", "<class 'str'>"],
            True,
            True,
            False,
        ]
