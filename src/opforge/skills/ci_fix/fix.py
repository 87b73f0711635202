"""ci-fix: run the linters on the files a change touched, apply only whitelisted fixes, prove each step kept
behaviour, and list what is left.

Each file goes through rounds of steps until a round changes nothing: ruff's safe fixes (one non-overlapping
batch per step), the formatter, then codespell's typo fixes. Every step is proven against the text before
it; a step that fails its proof is split, and the fixes that fail alone are excluded and reported. The file
is written once, atomically, at the end (never with --dry-run).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from opforge.errors import InputError
from opforge.i18n import N_, Msg
from opforge.skills.ci_fix import gitrepo, proof
from opforge.skills.ci_fix.edits import Block, Text, apply_blocks, diff_blocks, overlaps, remap_lines, runs
from opforge.skills.ci_fix.linters import Diagnostic, Linters, Typo
from opforge.skills.ci_fix.regions import c_regions, doc_regions, kind_at, python_regions, split_lines
from opforge.skills.ci_fix.whitelist import Whitelist, load_whitelist
from opforge.workspace.atomic import write_bytes_atomic

PYTHON = {".py", ".pyi"}
C_CPP = {".c", ".h", ".cc", ".cpp", ".cxx", ".c++", ".hh", ".hpp", ".hxx", ".h++", ".inl", ".ipp", ".cu", ".cuh"}
MAX_ROUNDS = 4
MAX_ITERATIONS = 12
WORD = r"[\w\-'’]"
TYPO_WHY = {
    "string": N_("inside a string literal, which is behaviour: never edited"),
    "code": N_("in code (an identifier): renaming changes behaviour"),
    "doctest": N_("in a doctest example inside a docstring, which runs as code"),
    "unlocated": N_("codespell's word could not be located on its line"),
    "unparsed": N_("the file does not parse, so a comment cannot be told from a string"),
    "docstring": N_("in a docstring, and docstring fixes are off in the whitelist"),
    "comment": N_("in a comment, and comment fixes are off in the whitelist"),
}
TYPO_REASON = {"comment": N_("typo in a comment"), "docstring": N_("typo in a docstring"),
               "prose": N_("typo in documentation")}
FORMAT_REASON = N_("formatting only: whitespace and layout, proven not to change the {what}")


@dataclass
class Fix:
    file: str
    step: int
    block: int
    tool: str
    rule: str
    reason: str
    message: str
    edit: Block

    def to_dict(self) -> dict:
        return {"file": self.file, "step": self.step, "block": self.block, "tool": self.tool, "rule": self.rule,
                "reason": self.reason, "message": self.message, **self.edit.to_dict()}


@dataclass
class Residual:
    file: str
    line: int
    tool: str
    rule: str
    message: str
    why: str

    def to_dict(self) -> dict:
        return self.__dict__.copy()


@dataclass
class Job:
    rel: str
    path: Path
    lang: str                                   # python | c | doc
    original: str
    changed: set[int] | None
    text: str = ""
    steps: list[dict] = field(default_factory=list)
    fixes: list[Fix] = field(default_factory=list)
    excluded: dict[tuple, str] = field(default_factory=dict)
    format_off: str | None = None
    failed: str | None = None                   # an unexpected error: the file is left as it was

    def give_up(self, exc: Exception) -> None:
        self.failed = f"{type(exc).__name__}: {exc}"
        self.text, self.steps, self.fixes = self.original, [], []

    def __post_init__(self):
        self.text = self.original

    def in_change(self, first: int, last: int | None = None) -> bool:
        return self.changed is None or any(r in self.changed for r in range(first, (last or first) + 1))

    def commit_step(self, tool: str, new_text: str, blocks: list[Block], records: list[list[tuple]]) -> None:
        """Record a proven step: `records[i]` lists (rule, reason, message) for the fixes behind blocks[i]."""
        step = len(self.steps)
        self.steps.append({"step": step, "tool": tool, "blocks": [b.to_dict() for b in blocks]})
        for bi, (b, recs) in enumerate(zip(blocks, records)):
            for rule, reason, message in recs:
                self.fixes.append(Fix(self.rel, step, bi, tool, rule, reason, message, b))
        if self.changed is not None:
            self.changed = remap_lines(self.changed, self.text, new_text)
        self.text = new_text


def _lang(rel: str, wl: Whitelist) -> str | None:
    suffix = Path(rel).suffix.lower()
    if suffix in PYTHON:
        return "python"
    if suffix in C_CPP:
        return "c"
    if suffix in wl.docs:
        return "doc"
    return None


def _ruff_key(d: Diagnostic, text: str) -> tuple:
    lines = split_lines(text)
    return ("ruff", d.code, d.message, lines[d.row - 1].strip() if 0 < d.row <= len(lines) else "")


def _ruff_allowed(d: Diagnostic, job: Job, wl: Whitelist) -> bool:
    if not d.fix or d.fix.get("applicability") != "safe" or not wl.ruff_reason(d.code):
        return False
    return not (d.code == "F401" and Path(job.rel).name in wl.reexport_files)


def _ruff_step(job: Job, lint: Linters, wl: Whitelist) -> bool:
    """Apply one batch of non-overlapping whitelisted safe fixes; False when there is nothing left to apply."""
    diags = lint.ruff_check(job.rel, job.text)
    t = Text(job.text)
    chosen: list[tuple[Block, list[Diagnostic]]] = []
    for d in sorted(diags, key=lambda d: d.code == "I001"):
        if not _ruff_allowed(d, job, wl) or _ruff_key(d, job.text) in job.excluded:
            continue
        edits = [(t.offset(e["location"]["row"], e["location"]["column"] - 1),
                  t.offset(e["end_location"]["row"], e["end_location"]["column"] - 1), e["content"])
                 for e in d.fix["edits"]]
        if not edits:
            continue
        block = t.block(edits)
        if not job.in_change(block.line, block.last) and not job.in_change(d.row, d.end_row):
            continue
        same = next((c for c in chosen if c[0] == block), None)
        if same:
            same[1].append(d)             # ruff gives one shared edit to each name of `import a, b`
        elif not any(overlaps(block, c[0]) for c in chosen):
            chosen.append((block, [d]))
    if not chosen:
        return False
    if any(d.code != "I001" for _b, dd in chosen for d in dd):
        # sort imports last, once removals are done, so its edit is not undone by a later one
        chosen = [c for c in chosen if any(d.code != "I001" for d in c[1])] or chosen

    def prove(group):
        new = apply_blocks(job.text, [b for b, _ in group])
        ds = [d for _b, dd in group for d in dd]
        removed = {(d.row, d.col - 1) for d in ds if d.code == "F401"}
        return new, proof.prove_python(job.text, new, removed, any(d.code == "I001" for d in ds))

    new, why = prove(chosen)
    if why:
        # exclude the fixes that fail on their own; all of them when only their combination fails
        alone = [(group, prove([group])[1]) for group in chosen]
        failing = [(g, w) for g, w in alone if w] or [(g, why) for g in chosen]
        for group, reason in failing:
            for d in group[1]:
                job.excluded[_ruff_key(d, job.text)] = Msg(N_("reverted: {why}"), why=reason)
        return True
    job.commit_step("ruff", new, [b for b, _ in chosen],
                    [[(d.code, wl.ruff_reason(d.code), d.message) for d in dd] for _b, dd in chosen])
    return True


def _apply_replacements(text: str, reps: list[tuple[int, int, str]]) -> str:
    data = text.encode("utf-8")
    for off, length, new in sorted(reps, reverse=True):
        data = data[:off] + new.encode("utf-8") + data[off + length:]
    return data.decode("utf-8")


def _whitespace_only(text: str, reps: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    data = text.encode("utf-8")
    return [r for r in reps if not r[2].strip() and not data[r[0]:r[0] + r[1]].strip()]


def _format_text(job: Job, lint: Linters, wl: Whitelist, sort_includes: bool | None,
                 whitespace_only: bool = False) -> str | None:
    """The formatter's output for the job's text (changed lines only when the job has them); for C/C++,
    `whitespace_only` keeps only the replacements that swap whitespace for whitespace."""
    if job.lang == "python":
        if job.changed is None:
            return lint.ruff_format(job.rel, job.text)
        new = job.text
        for a, b in reversed(runs(job.changed)):
            new = lint.ruff_format(job.rel, new, (a, b))
            if new is None:
                return None
        return new
    if job.changed is not None and not job.changed:
        return job.text
    reps = lint.clang_format(job.path, job.text, runs(job.changed) if job.changed is not None else None,
                             sort_includes)
    return _apply_replacements(job.text, _whitespace_only(job.text, reps) if whitespace_only else reps)


def _format_step(job: Job, lint: Linters, wl: Whitelist) -> bool:
    if job.format_off or (job.changed is not None and not job.changed):
        return False
    if job.lang == "python" and not wl.ruff_format or job.lang == "c" and not wl.clang_format:
        return False
    new = _format_text(job, lint, wl, None if wl.clang_format_sort_includes else False)
    if new is None:
        job.format_off = Msg(N_("ruff format cannot parse the file"))
        return False
    if new == job.text:
        return False
    if job.lang == "python":
        why = proof.prove_python(job.text, new)
    else:
        why = proof.prove_c(job.text, new)
    if why and job.lang == "c":
        # the style also moves tokens (braces, qualifiers...): keep its whitespace-only replacements
        job.format_off = Msg(N_("reverted: {why}"), why=why)
        new = _format_text(job, lint, wl, None if wl.clang_format_sort_includes else False, whitespace_only=True)
        if new == job.text or proof.prove_c(job.text, new):
            return False
        job.format_off = Msg(N_("only the whitespace-only replacements were kept; the rest reverted: {why}"), why=why)
    elif why:
        job.format_off = Msg(N_("reverted: {why}"), why=why)
        return False
    tool = "ruff format" if job.lang == "python" else "clang-format"
    what = "AST" if job.lang == "python" else Msg(N_("token stream"))
    blocks = diff_blocks(job.text, new)
    record = ("format", Msg(FORMAT_REASON, what=what), Msg(N_("reformatted")))
    job.commit_step(tool, new, blocks, [[record]] * len(blocks))
    return True


def _regions(job: Job, text: str):
    if job.lang == "python":
        return python_regions(text)
    if job.lang == "c":
        return c_regions(text)
    return doc_regions(text)


def _locate(line: str, wrong: str) -> list[int]:
    cols = [m.start() for m in re.finditer(rf"(?<!{WORD}){re.escape(wrong)}(?!{WORD})", line)]
    return cols or [m.start() for m in re.finditer(rf"\b{re.escape(wrong)}\b", line)]


def _typo_places(job: Job, typos: list[Typo], text: str, wl: Whitelist) -> list[tuple[Typo, int, str]]:
    """Each typo with its column and the kind of place it is in (comment, docstring, string, code, prose)."""
    regions = _regions(job, text)
    lines = split_lines(text)
    seen: dict[tuple[int, str], int] = {}
    out = []
    for ty in typos:
        line = lines[ty.row - 1] if 0 < ty.row <= len(lines) else ""
        cols = _locate(line, ty.wrong)
        k = seen.get((ty.row, ty.wrong), 0)
        seen[(ty.row, ty.wrong)] = k + 1
        if k >= len(cols):
            out.append((ty, -1, "unlocated"))
            continue
        col = cols[k]
        if regions is None:
            kind = "unparsed"
        else:
            kind = kind_at(regions, ty.row, col, col + len(ty.wrong), "prose" if job.lang == "doc" else "code")
            if kind == "docstring" and line.lstrip().startswith((">>>", "...")):
                kind = "doctest"          # a doctest example is code that runs
        out.append((ty, col, kind))
    return out


def _typo_ok(kind: str, wl: Whitelist) -> bool:
    return (kind == "comment" and wl.comments) or (kind == "docstring" and wl.docstrings) or kind == "prose"


def _typo_key(ty: Typo, text: str) -> tuple:
    lines = split_lines(text)
    return ("codespell", ty.wrong, lines[ty.row - 1].strip() if 0 < ty.row <= len(lines) else "")


def _codespell_step(job: Job, typos: list[Typo], wl: Whitelist) -> bool:
    t = Text(job.text)
    by_row: dict[int, list[tuple[Typo, int, str]]] = {}
    for ty, col, kind in _typo_places(job, typos, job.text, wl):
        if (col < 0 or not ty.single or not _typo_ok(kind, wl) or not job.in_change(ty.row)
                or _typo_key(ty, job.text) in job.excluded):
            continue
        by_row.setdefault(ty.row, []).append((ty, col, kind))
    if not by_row:
        return False
    blocks, groups, records = [], [], []
    for row, items in sorted(by_row.items()):
        edits = [(t.offset(row, col), t.offset(row, col + len(ty.wrong)), ty.right) for ty, col, _ in items]
        blocks.append(t.block(edits))
        groups.append([ty for ty, _col, _kind in items])
        records.append([(f"typo:{ty.wrong}", Msg(TYPO_REASON[kind]), f"{ty.wrong} ==> {ty.right}")
                        for ty, _col, kind in items])

    def prove(bs, tys):
        new = apply_blocks(job.text, bs)
        subs = {(ty.wrong, ty.right) for ty in tys}
        if job.lang == "python":
            return new, proof.prove_python(job.text, new, subs=subs)
        if job.lang == "c":
            return new, proof.prove_c(job.text, new)
        return new, proof.prove_doc(job.text, new, subs)

    new, why = prove(blocks, [ty for g in groups for ty in g])
    if why:
        alone = [(g, prove([b], g)[1]) for b, g in zip(blocks, groups)]
        failing = [(g, w) for g, w in alone if w] or [(g, why) for g in groups]
        for g, reason in failing:
            for ty in g:
                job.excluded[_typo_key(ty, job.text)] = Msg(N_("reverted: {why}"), why=reason)
        return True
    job.commit_step("codespell", new, blocks, records)
    return True


def _process(jobs: list[Job], lint: Linters, wl: Whitelist, progress=None) -> None:
    """Rounds over all files until one changes nothing; codespell runs once per round for all of them."""
    active = list(jobs)
    for round_ in range(MAX_ROUNDS):
        marks = {id(j): len(j.steps) + len(j.excluded) for j in active}
        for i, job in enumerate(active):
            if progress and round_ == 0:
                progress(job.rel, i, len(jobs))
            try:
                if job.lang == "python":
                    for _i in range(MAX_ITERATIONS):
                        if not _ruff_step(job, lint, wl):
                            break
                if job.lang in ("python", "c"):
                    _format_step(job, lint, wl)
            except InputError:
                raise
            except Exception as exc:  # one odd file must not cost the report of all the others
                job.give_up(exc)
        active = [j for j in active if not j.failed]
        typos = lint.codespell({j.rel: j.text for j in active})
        for job in active:
            try:
                _codespell_step(job, typos[job.rel], wl)
            except Exception as exc:
                job.give_up(exc)
        # a step that failed its proof changes nothing but excludes fixes: the rest get another round
        active = [j for j in active if not j.failed and len(j.steps) + len(j.excluded) != marks[id(j)]]
        if not active:
            break


# residual ------------------------------------------------------------------------------------------------------

def _ruff_why(d: Diagnostic, job: Job, wl: Whitelist) -> str:
    if _ruff_key(d, job.text) in job.excluded:
        return job.excluded[_ruff_key(d, job.text)]
    if d.code == "F401" and Path(job.rel).name in wl.reexport_files:
        return Msg(N_("unused import in a re-exporting module: it may be public API, so it is never removed "
                      "automatically"))
    if not d.fix:
        return Msg(N_("ruff offers no automatic fix"))
    applicability = d.fix.get("applicability")
    if applicability != "safe":
        return Msg(N_("ruff's fix is {applicability}: never applied"), applicability=applicability)
    if not wl.ruff_reason(d.code):
        return Msg(N_("the rule is not in the whitelist"))
    return Msg(N_("a whitelisted fix that did not converge"))


def _typo_why(ty: Typo, kind: str, job: Job, wl: Whitelist) -> str:
    if _typo_key(ty, job.text) in job.excluded:
        return job.excluded[_typo_key(ty, job.text)]
    if ty.reason:
        return Msg(N_("codespell's dictionary does not fix this one automatically: {reason}"), reason=ty.reason)
    if not ty.single:
        return Msg(N_("several candidates ({candidates}): a person must choose"), candidates=ty.right)
    return Msg(TYPO_WHY.get(kind, N_("inside code in a documentation file")))


def _residual(job: Job, lint: Linters, wl: Whitelist, typos: list[Typo]) -> list[Residual]:
    if job.failed:
        return [Residual(job.rel, 1, "ci-fix", "error", Msg(N_("the file could not be processed")),
                         Msg(N_("left unchanged: {error}"), error=job.failed))]
    out: list[Residual] = []
    if job.lang == "python":
        for d in lint.ruff_check(job.rel, job.text):
            if job.in_change(d.row, d.end_row):
                out.append(Residual(job.rel, d.row, "ruff", d.code, d.message, _ruff_why(d, job, wl)))
    if (job.lang == "python" and wl.ruff_format) or (job.lang == "c" and wl.clang_format):
        tool = "ruff format" if job.lang == "python" else "clang-format"
        formatted = _format_text(job, lint, wl, None)
        if formatted is None:
            out.append(Residual(job.rel, 1, tool, "format", Msg(N_("cannot format")),
                                job.format_off or Msg(N_("ruff format cannot parse the file"))))
        elif formatted != job.text:
            first = diff_blocks(job.text, formatted)[0].line
            why = job.format_off
            if not why and job.lang == "c" and not wl.clang_format_sort_includes:
                why = Msg(N_("#include order: include sorting is not whitelisted (it can change what a file means)"))
            out.append(Residual(job.rel, first, tool, "format", Msg(N_("the file is not formatted")),
                                why or Msg(N_("formatting did not converge"))))
    for ty, _col, kind in _typo_places(job, typos, job.text, wl):
        if job.in_change(ty.row):
            out.append(Residual(job.rel, ty.row, "codespell", f"typo:{ty.wrong}", f"{ty.wrong} ==> {ty.right}",
                                _typo_why(ty, kind, job, wl)))
    return out


# the run -------------------------------------------------------------------------------------------------------

def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def ci_fix(repo: Path, base: str = "HEAD", changed_lines: bool = False, dry_run: bool = False,
           config: Path | None = None, commit: bool = False, report_dir: Path | None = None,
           progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Fix the change in `repo` against `base`; returns the report (see report.py). Files under `report_dir`
    (where the report goes) are not part of the change."""
    if dry_run and commit:
        raise InputError("--commit", "cannot commit a --dry-run")
    wl = load_whitelist(config)
    commands: list[dict] = []

    def log(argv, rc, stdin=None):
        commands.append({"command": shlex.join(str(a) for a in argv), "exit_code": rc,
                         **({"stdin": Msg(N_("current text of {file}"), file=stdin)} if stdin else {})})

    git = gitrepo.open_repo(Path(repo), log)
    base_sha = gitrepo.fork_point(git, base)
    changes = gitrepo.changed_files(git, base_sha, changed_lines)
    lint = Linters(git.repo, log)
    jobs, skipped = [], []
    own = Path(report_dir).resolve() if report_dir is not None else None
    for ch in changes:
        if own is not None and (git.repo / ch.path).resolve().is_relative_to(own):
            continue
        lang = _lang(ch.path, wl)
        if lang is None:
            skipped.append({"file": ch.path, "why": Msg(N_("no linter for this kind of file"))})
            continue
        try:
            text = (git.repo / ch.path).read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            skipped.append({"file": ch.path, "why": Msg(N_("not UTF-8 text"))})
            continue
        jobs.append(Job(ch.path, git.repo / ch.path, lang, text, ch.lines))
    _process(jobs, lint, wl, progress)
    typos = lint.codespell({j.rel: j.text for j in jobs}) if jobs else {}
    residual = [r for job in jobs for r in _residual(job, lint, wl, typos[job.rel])]
    if progress:
        progress("", len(jobs), len(jobs))
    edited = [j for j in jobs if j.text != j.original]
    if not dry_run:
        for j in edited:
            write_bytes_atomic(j.path, j.text.encode("utf-8"))
    commit_sha = None
    fixes = [f for j in jobs for f in j.fixes]
    if commit and edited:
        commit_sha = gitrepo.commit(git, [j.rel for j in edited], commit_message(fixes, len(edited)))
    return {
        "repo": str(git.repo), "base": base, "base_commit": base_sha, "changed_lines_only": changed_lines,
        "dry_run": dry_run, "commit": commit_sha, "whitelist": wl.to_dict(),
        "files": [{"file": j.rel, "language": j.lang, "edited": j.text != j.original,
                   "sha256_before": _sha(j.original), "sha256_after": _sha(j.text), "steps": j.steps}
                  for j in jobs],
        "skipped": skipped, "commands": commands,
        "fixes": [f.to_dict() for f in fixes],
        "residual": [r.to_dict() for r in residual],
        "summary": _summary(jobs, fixes, residual, skipped),
        "exit_code": 1 if residual else 0,
    }


def commit_message(fixes: list[Fix], n_files: int) -> str:
    lines = [f"ci-fix: {len(fixes)} whitelisted fix(es) in {n_files} file(s)", ""]
    for f in fixes:
        lines.append(f"- {f.file}:{f.edit.line} {f.tool} {f.rule}: {f.message}")
    return "\n".join(lines) + "\n"


def _summary(jobs: list[Job], fixes: list[Fix], residual: list[Residual], skipped: list[dict]) -> dict:
    by_rule: dict[str, int] = {}
    for f in fixes:
        key = f"{f.tool} {f.rule if not f.rule.startswith('typo:') else 'typo'}"
        by_rule[key] = by_rule.get(key, 0) + 1
    res_rule: dict[str, int] = {}
    for r in residual:
        key = f"{r.tool} {r.rule if not r.rule.startswith('typo:') else 'typo'}"
        res_rule[key] = res_rule.get(key, 0) + 1
    return {"files_checked": len(jobs), "files_edited": sum(j.text != j.original for j in jobs),
            "files_skipped": len(skipped), "fixes": len(fixes), "residual": len(residual),
            "fixes_by_rule": by_rule, "residual_by_rule": res_rule}
