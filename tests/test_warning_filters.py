"""The suite fails on a deprecation the project's own code triggers (pyproject.toml's
filterwarnings, issue 32), and only on those: a warning is attributed to the module whose code
calls `warnings.warn` (or the caller a library's stacklevel names), so the same call made from
a third-party module's code still only warns."""

import warnings

import pytest

SOURCE = "import warnings\nwarnings.warn('old API', CATEGORY, stacklevel=1)\n"


def warn_from(module: str, category: type[Warning]) -> None:
    """Run a `warnings.warn` call as code of `module` (the attribution reads the frame's
    `__name__`), under the filters pytest applies from the configuration."""
    code = compile(SOURCE, f"<{module}>", "exec")
    exec(code, {"__name__": module, "CATEGORY": category})


@pytest.mark.parametrize("module", ["scale_ablation.model.attention", "experiments.base",
                                    "benchmarks.throughput"])
@pytest.mark.parametrize("category", [DeprecationWarning, FutureWarning])
def test_a_deprecation_from_the_project_fails(module, category):
    with pytest.raises(category, match="old API"):
        warn_from(module, category)


@pytest.mark.parametrize("module", ["optax._src.linear_algebra", "flax.nnx.module"])
def test_the_same_deprecation_from_a_library_only_warns(module):
    with warnings.catch_warnings(record=True) as caught:  # the configured filters, kept
        warn_from(module, DeprecationWarning)
    assert [(w.category, str(w.message)) for w in caught] == [(DeprecationWarning, "old API")]
