"""ci-static-errors-fix: whitelisted linter fixes on a change, each step proven not to change behaviour."""

from opforge.skills.ci_fix.fix import ci_fix

__all__ = ["ci_fix"]
