"Every public function, class and public method of the package has a docstring."
import importlib
import inspect
import pkgutil

import pytest

import minitrain_inspect

MODULES = sorted(m.name for m in pkgutil.iter_modules(minitrain_inspect.__path__) if not m.name.startswith("_"))


def _public_objects(module):
    for name in getattr(module, "__all__", []):
        obj = getattr(module, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue            # constants carry no docstring of their own
        if getattr(obj, "__module__", None) != module.__name__:
            continue            # re-exported: checked where it is defined
        yield f"{module.__name__}.{name}", obj
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not (inspect.isfunction(member) or isinstance(member, property)):
                    continue
                yield f"{module.__name__}.{name}.{attr}", getattr(obj, attr)  # getdoc inherits a base method's doc


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_name_has_a_docstring(module_name):
    module = importlib.import_module(f"minitrain_inspect.{module_name}")
    assert (module.__doc__ or "").strip(), f"module {module_name} has no docstring"
    missing = [name for name, obj in _public_objects(module) if not (inspect.getdoc(obj) or "").strip()]
    assert not missing, f"public names without a docstring: {missing}"
