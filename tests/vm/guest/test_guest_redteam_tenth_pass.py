"""Tenth red-team pass on the in-interpreter layer: hooks that trusted code calls with what it
holds. Three real escapes, each handing the plugin the real `type` (whose three-argument call
builds a class from any namespace: an ABC admitting any subject with `__match_args__ =
("__globals__",)`, then a class pattern over a host function, gave the real builtins):

1. **Metaclass hooks on a class.** `abc`'s C checks look `__subclasscheck__` and
   `__subclasses__` up on the class with an ordinary attribute lookup, where a class body's
   own definition shadows the metaclass's: `isinstance(int, P)` called `P.__subclasscheck__`
   with `type(int)`, the real `type`, and `issubclass(C, obj)` calls `obj.__subclasscheck__(C)`
   (an object in a `__subclasses__` list, or in `typing.Union[...]`). A class body may no
   longer define `__subclasscheck__`, `__instancecheck__` or `__subclasses__` (refused at
   load), nor may a plugin class carry one another way.
2. **A metaclass seen while it is made.** `class M(typing.Type[int])` derives from `type`
   and was refused once it existed, but `type.__new__` had already run the plugin's
   `__set_name__` (and a base's `__init_subclass__`, and a descriptor's `__get__` that `abc`
   reads) with M. The bases are now resolved and checked before the class is made.
3. **`typing.Type`'s origin compared with the plugin's object.** `class C(typing.Type[int],
   obj)` runs typing's `__mro_entries__`, which tests `self.__origin__ not in bases`:
   `obj.__eq__` was handed the real `type`. `typing.Type`'s origin is the guest's `type` in
   the worker now (and typing's caches are cleared), so nothing typing compares holds it.

Each ran in real workers on 3.11-3.13 before its fix (the escape corpus carries the attacks:
`dyncode_abc_subclasscheck_real_type`, `class_metaclass_set_name_before_refusal`,
`dyncode_typing_type_origin_eq_in_bases`). A fourth finding was no escape but a way around
a stated guarantee: on 3.12+ a Protocol's `isinstance` checks the members typing listed when
the class was made, so a private member deleted afterwards passed the runtime's member check
and still made `isinstance` an oracle of foreign objects' private attributes
(`introspect_protocol_deleted_private_member`); the check now covers those members too.
The rest pins probes of this pass that were already contained: a `str` subclass hashing and comparing as `__globals__` given to
`getattr`, a traceback handed to `__exit__`, a generator made by trusted code, the real
`functools.wraps` that `typing.no_type_check_decorator` runs, and a class trusted code builds
on a plugin mixin.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _redteam_support import create_plugin, outcome

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm import VmSandbox
from suaveplan_sandbox.vm._guest._guards import PLUGIN_CLASSES, refuse_metaclass_hooks
from suaveplan_sandbox.vm._guest._policy import METACLASS_HOOKS, check_module

FORBIDDEN = "SAND_VM_ATTRIBUTE_FORBIDDEN"
INDIRECT = "SAND_VM_INDIRECT_EVAL_REJECTED"

# Each made the real `type` (or `types.FunctionType`) the plugin's before the fix; now each
# is refused when the sandbox is created.
METACLASS_HOOK_ATTACKS = {
    "abc_subclasscheck": """
import typing

got = []


class Probe(typing.Hashable):
    @staticmethod
    def __subclasscheck__(checked):
        got.append(checked)
        return False


def attack():
    isinstance(int, Probe)
    return repr(got[0]("Made", (), {}))
""",
    "abc_subclasses_list": """
import typing

got = []


class Grab:
    def __subclasscheck__(self, checked):
        got.append(checked)
        return False


class Probe(typing.Hashable):
    @staticmethod
    def __subclasses__():
        return [Grab()]


def attack():
    isinstance(int, Probe)
    return repr(got[0]("Made", (), {}))
""",
    "union_member_subclasscheck": """
import typing

got = []


class Grab:
    def __call__(self):
        pass

    def __subclasscheck__(self, checked):
        got.append(checked)
        return False


def attack():
    isinstance(int, typing.Union[str, Grab()])
    return repr(got[0]("Made", (), {}))
""",
    "instancecheck": """
class Probe:
    def __instancecheck__(self, obj):
        return True


def attack():
    return isinstance(1, Probe())
""",
}

ROUTES = """
import enum
import typing

from suaveplan import fs

U = "_" * 2
made = []


class Keep:
    def __set_name__(self, owner, name):
        made.append(owner)


class Base:
    def __init_subclass__(cls):
        made.append(cls)


class Grabbed:
    def __get__(self, instance, owner):
        made.append(owner)
        return self


class Abstract(typing.Hashable):
    @typing.abstractmethod
    def grabbed(self):
        pass


def metaclass_through_set_name():
    class Meta(typing.Type[int]):
        keep = Keep()

    return "defined"


def metaclass_through_init_subclass():
    class Meta(typing.Type[int], Base):
        pass

    return "defined"


def metaclass_through_an_abstract_lookup():
    class Meta(typing.Type[int], Abstract):
        grabbed = Grabbed()

    return "defined"


def subclass_of_the_guest_type():
    class Meta(type):
        keep = Keep()

    return "defined"


def metaclasses_seen_while_made():
    return [repr(meta("Made", (), {})) for meta in made]


compared = []


class Eq:
    def __eq__(self, other):
        compared.append(other)
        return False

    def __hash__(self):
        return 0

    def __mro_entries__(self, bases):
        return ()


def typing_type_origin_compared_with_a_base():
    try:
        class C(typing.Type[int], Eq()):
            pass
    except Exception:
        pass
    return [compared[0] is type, len(compared) > 0]


def compared_origin_called():
    return repr(compared[0]("Made", (), {}))


class Shape(typing.Hashable):
    @classmethod
    def __subclasshook__(cls, other):
        return NotImplemented

    def __hash__(self):
        return 0


class Square(Shape):
    pass


class Other:
    pass


Shape.register(Other)
T = typing.TypeVar("T")


class Box(typing.Generic[T]):
    pass


@typing.runtime_checkable
class Named(typing.Protocol):
    def name(self):
        pass


class HasName:
    def name(self):
        return "n"


def legit():
    return [
        isinstance(int, typing.Type),
        typing.get_origin(typing.Type[int]) is type,
        typing.get_args(typing.Type[int]) == (int,),
        typing.get_origin(typing.Type) is type,
        isinstance(Square(), Shape),
        issubclass(Other, Shape),
        isinstance(1, Shape),
        isinstance(HasName(), Named),
        isinstance(1, Named),
        repr(Box[int]),
        isinstance(1, typing.Union[int, str]),
    ]


@typing.runtime_checkable
class Hashed(typing.Protocol):
    def __hash__(self):
        return 0


class Deleted(Hashed, typing.Protocol):
    _is_runtime_protocol = True

    def _evaluate(self):
        pass


del Deleted._evaluate


def protocol_member_deleted_after_it_was_listed():
    forward_ref = typing.get_args(typing.List["int"])[0]  # noqa: UP006
    return [isinstance(forward_ref, Deleted), isinstance(1, Deleted)]


# -- probes that were already contained --------------------------------------------------


class Posing(str):
    def __hash__(self):
        return hash(U + "globals" + U)

    def __eq__(self, other):
        return True


def str_subclass_posing_as_a_dunder_name():
    try:
        getattr(fs.read_text, Posing("harmless"))
    except AttributeError:
        return ["AttributeError", hasattr(fs.read_text, Posing("harmless"))]
    return "read"


class Catch:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        self.tb = tb
        return True


def _traceback():
    catch = Catch()
    with catch:
        fs.read_text(1, 2, 3, 4)
    return catch.tb


def traceback_lineno():
    return isinstance(_traceback().tb_lineno, int)


def traceback_frame_through_getattr():
    return repr(getattr(_traceback(), "tb_" + "frame"))


def traceback_frame_through_format():
    return ("{0.tb_" + "frame}").format(_traceback())


def type_of_a_traceback():
    return repr(type(_traceback()))


class Color(enum.Enum):
    RED = 1


def trusted_generator_frame_through_getattr():
    return repr(getattr(iter(Color), "gi_" + "frame"))


def type_of_a_trusted_generator():
    return repr(type(iter(Color)))


def _wrapped_forward_ref():
    forward_ref = type(typing.get_args(typing.List["int"])[0])  # noqa: UP006
    return typing.no_type_check_decorator(forward_ref)


def real_wraps_copy_into_a_trusted_closure():
    return repr(getattr(_wrapped_forward_ref(), "_evaluate"))


def real_wraps_copy_read_as_an_attribute():
    return repr(_wrapped_forward_ref()._evaluate)


class Mixin:
    def __init_subclass__(cls):
        made_by_trusted.append(cls)


made_by_trusted = []


def mixin_class_made_by_trusted_code():
    enum.Enum("Made", "a b", type=Mixin)
    return repr(made_by_trusted[-1]._member_map_)
"""


async def _create(tmp_path: Path, source: str) -> VmSandbox:
    return await create_plugin(tmp_path, source, name="redteam10")


@pytest.mark.parametrize("name", sorted(METACLASS_HOOK_ATTACKS))
async def test_a_class_may_not_define_a_metaclass_hook(tmp_path: Path, name: str) -> None:
    with pytest.raises(SuaveplanError) as err:
        async with await _create(tmp_path, METACLASS_HOOK_ATTACKS[name]) as sb:
            await sb.call("attack")
    assert err.value.code == FORBIDDEN
    assert err.value.details.get("file") == "plugin.py"


@pytest.mark.parametrize("hook", sorted(METACLASS_HOOKS))
def test_the_policy_refuses_each_metaclass_hook_in_a_class_body(hook: str) -> None:
    with pytest.raises(SuaveplanError) as err:
        check_module(f"class C:\n    def {hook}(self, other):\n        pass\n", "plugin.py")
    assert err.value.code == FORBIDDEN
    # The same name on a plain function is refused as any dunder function is.
    with pytest.raises(SuaveplanError):
        check_module(f"def {hook}(other):\n    pass\n", "plugin.py")


def test_a_plugin_class_carrying_a_metaclass_hook_is_refused_when_made() -> None:
    carried = type("Carried", (), {"__subclasses__": staticmethod(lambda: [])})
    with pytest.raises(SuaveplanError) as err:
        refuse_metaclass_hooks(carried)
    assert err.value.code == FORBIDDEN
    PLUGIN_CLASSES.add(carried)
    child = type("Child", (carried,), {})
    with pytest.raises(SuaveplanError):
        refuse_metaclass_hooks(child)


def test_a_foreign_classs_own_metaclass_hook_is_trusted_code() -> None:
    import types

    # `types.GenericAlias` defines `__instancecheck__` (it raises); a subclass may exist.
    refuse_metaclass_hooks(type("Alias", (types.GenericAlias,), {}))


@pytest.mark.parametrize(
    "name",
    [
        "metaclass_through_set_name",
        "metaclass_through_init_subclass",
        "metaclass_through_an_abstract_lookup",
        "subclass_of_the_guest_type",
    ],
)
async def test_no_hook_sees_a_metaclass_while_it_is_made(tmp_path: Path, name: str) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await outcome(sb, name) == INDIRECT
        assert await sb.call("metaclasses_seen_while_made") == []


async def test_typing_type_never_compares_the_real_type_with_a_plugin_object(
    tmp_path: Path,
) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        # What typing compares is the guest's `type`, whose three-argument call is refused.
        assert await sb.call("typing_type_origin_compared_with_a_base") == [True, True]
        assert await outcome(sb, "compared_origin_called") == INDIRECT


async def test_a_protocol_is_no_oracle_through_a_member_it_deleted(tmp_path: Path) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        # 3.11 checks the members the class has now (none private, no oracle); 3.12+ the
        # ones typing listed when it was made, `_evaluate` included.
        assert await outcome(sb, "protocol_member_deleted_after_it_was_listed") in (
            FORBIDDEN,
            ("ok", [True, True]),
        )


async def test_abcs_protocols_and_typing_type_keep_working(tmp_path: Path) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await sb.call("legit") == [
            True,
            True,
            True,
            True,
            True,
            True,
            False,
            True,
            False,
            "plugin.Box[int]",
            True,
        ]


async def test_a_str_subclass_posing_as_a_dunder_is_looked_up_as_its_text(
    tmp_path: Path,
) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await sb.call("str_subclass_posing_as_a_dunder_name") == ["AttributeError", False]


async def test_a_traceback_handed_to_exit_stays_opaque(tmp_path: Path) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await sb.call("traceback_lineno") is True
        assert await outcome(sb, "traceback_frame_through_getattr") == FORBIDDEN
        assert await outcome(sb, "traceback_frame_through_format") == FORBIDDEN
        assert await outcome(sb, "type_of_a_traceback") == INDIRECT


async def test_a_generator_made_by_trusted_code_stays_opaque(tmp_path: Path) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await outcome(sb, "trusted_generator_frame_through_getattr") == FORBIDDEN
        assert await outcome(sb, "type_of_a_trusted_generator") == INDIRECT


async def test_the_real_wraps_copies_only_into_a_closure_the_plugin_cannot_open(
    tmp_path: Path,
) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await outcome(sb, "real_wraps_copy_into_a_trusted_closure") == FORBIDDEN
        assert await outcome(sb, "real_wraps_copy_read_as_an_attribute") == FORBIDDEN


async def test_a_class_trusted_code_builds_on_a_plugin_mixin_stays_foreign(
    tmp_path: Path,
) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await outcome(sb, "mixin_class_made_by_trusted_code") == FORBIDDEN
