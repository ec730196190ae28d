"""Deep search (the paper's BrowseComp domain): `pivot/search-v0`.

The action is the next browsing step of a search agent: a search, opening a document, or the final
answer. Calls run on an embedded search engine (SQLite FTS5 with bm25 over the bundled Wikipedia
summaries or the user's corpus; or an HTTP search endpoint) from the prefix state, rebuilt at reset
by replaying the prefix's calls; the retrieval verifier asks whether the step reaches the evidence
the expert's reached, and answers are scored by normalised exact match.
"""

from pivot_envs.domains.search.env import SearchEnv, SearchLimits
from pivot_envs.domains.search.verifier import LEVELS, SearchVerifier
from pivot_envs.registry import DomainSpec

DOMAIN = DomainSpec(
    name="search",
    env_class=SearchEnv,
    description="deep search: the next search, document opened or answer, on an embedded FTS5 engine over Wikipedia",
    verifiers=(*LEVELS, "strict"),
)

__all__ = ["DOMAIN", "LEVELS", "SearchEnv", "SearchLimits", "SearchVerifier"]
