"""pr-analysis: which upstream PyTorch changes an out-of-tree backend must adapt to, with evidence.

`analyze_window` grades the commits of a local clone; `release_diff` compares two releases' operator schemas.
"""

from opforge.skills.pr_analysis.analyze import analyze_window
from opforge.skills.pr_analysis.profile import Profile, load_profile
from opforge.skills.pr_analysis.release import release_diff

__all__ = ["Profile", "analyze_window", "load_profile", "release_diff"]
