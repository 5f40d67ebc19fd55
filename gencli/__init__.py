"""gencli: generative recommendation with semantic IDs, as a command-line tool suite.

Python API: ``from gencli import Recommender; Recommender.load(DIR).recommend(["i1", "i2"], k=10)``.
``Recommender`` is imported on first use, so ``import gencli`` (and ``gencli --help``) stays free of torch.
"""

from typing import TYPE_CHECKING, Any

from gencli.version import __version__

__all__ = ["Recommender", "Recommendation", "__version__"]

if TYPE_CHECKING:
    from gencli.core.infer.recommend import Recommendation, Recommender


def __getattr__(name: str) -> Any:
    if name in ("Recommender", "Recommendation"):
        from gencli.core.infer import recommend

        return getattr(recommend, name)
    raise AttributeError(f"module 'gencli' has no attribute {name!r}")
