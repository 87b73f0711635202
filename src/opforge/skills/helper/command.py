"""`opforge helper index|ask|eval`: questions about the installed torch, torch-npu and opforge answered from their
sources with file:line citations (corpus.py: what is read; chunks.py: how files become passages; index.py: the
SQLite/FTS5 index in the user's cache folder; ask.py: retrieval and the answer; evaluate.py: accuracy)."""
from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from opforge.errors import InputError, report_error
from opforge.i18n import _, set_language

helper_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                         help="helper: answers from torch, torch-npu and opforge sources, with citations")
DEFAULT_CORPORA = "torch,torch-npu,opforge"
_INDEX_HELP = "the index file (default: OPFORGE_HELPER_INDEX, else ~/.cache/opforge/helper/index.sqlite)"


def _fail(exc: InputError, as_json: bool) -> None:
    report_error(typer.echo, exc.where, exc.what, 2, as_json=as_json)
    raise typer.Exit(2)


@helper_app.command("index")
def index_command(
    corpus: str = typer.Option(DEFAULT_CORPORA, "--corpus", help="comma list of torch, torch-npu, opforge and "
                                                                 "folders"),
    npu_wheel: Path = typer.Option(None, "--npu-wheel", help="the torch-npu wheel (default: the cached one, else "
                                                             "pip download --no-deps into the cache)"),
    index_path: Path = typer.Option(None, "--index", help=_INDEX_HELP),
    as_json: bool = typer.Option(False, "--json", help="print what was built as JSON"),
):
    """Index the corpora (incrementally: unchanged files are kept); prints build time and size."""
    from opforge.skills.helper import corpus as cp
    from opforge.skills.helper import index

    path = index_path or index.default_path()
    names = [n.strip() for n in corpus.split(",") if n.strip()]
    notes = []
    try:
        if not names:
            raise InputError("--corpus", "names no corpus")
        try:
            resolved = cp.resolve(names, npu_wheel)
        except InputError as exc:
            if corpus != DEFAULT_CORPORA or exc.where != "--corpus" or "torch-npu" not in exc.what:
                raise
            notes.append(f"torch-npu skipped: {exc.what}")  # the default asks for it where it can be had
            resolved = cp.resolve([n for n in names if n != "torch-npu"])
        try:
            db = index.create(path)
        except Exception as exc:  # sqlite3.DatabaseError, OSError: a file that is no index of ours
            raise InputError(str(path), f"cannot open it as a helper index ({exc}): delete it or name another "
                                        "with --index") from exc
        built = []
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[file]}"),
                      TimeElapsedColumn(), console=Console(stderr=True), transient=True, disable=as_json) as bar:
            for name, (root, files) in resolved.items():
                task = bar.add_task(f"indexing {name}", total=None, file="")
                built.append(index.build(db, name, root, files(),
                                         progress=lambda f, task=task: bar.update(task, advance=1, file=f[-60:])))
        if any(b.removed for b in built):  # give back the space of passages that left with their files
            db.execute("VACUUM")
        db.close()
    except InputError as exc:
        _fail(exc, as_json)
    size_mb = round(path.stat().st_size / 2**20, 1)
    result = {"index": str(path), "size_mb": size_mb, "corpora": [b.__dict__ for b in built], "notes": notes,
              "seconds": round(sum(b.seconds for b in built), 1)}
    if as_json:
        typer.echo(json.dumps(result, indent=1))
        return
    for note in notes:
        typer.echo(note)
    for b in built:
        typer.echo(f"{b.corpus}: {b.files} files ({b.changed} indexed, {b.removed} removed), {b.chunks} passages, "
                   f"{b.seconds} s")
    typer.echo(f"index {path}: {size_mb} MB, built in {result['seconds']} s")


@helper_app.command("ask")
def ask_command(
    question: str = typer.Argument(..., help="the question; an error message or log in it is routed to a skill"),
    k: int = typer.Option(5, "--k", min=1, max=50, help="citations to return"),
    corpus: str = typer.Option("", "--corpus", help="only these corpora (comma list; default: all indexed)"),
    run: bool = typer.Option(False, "--run", help="run the answer's code in a child process and show its output"),
    timeout: float = typer.Option(60.0, "--timeout", min=1.0, help="seconds --run may take"),
    index_path: Path = typer.Option(None, "--index", help=_INDEX_HELP),
    llm_config: str = typer.Option(None, "--llm-config", help="a model to write the answer from the passages "
                                                              "(default: $OPFORGE_LLM_CONFIG or ./opforge-llm.yaml "
                                                              "where one exists)"),
    no_model: bool = typer.Option(False, "--no-model", help="answer from the passages alone, even with a model"),
    lang: str = typer.Option(None, "--lang", help="the answer's language: en | zh (default: OPFORGE_LANG, else en; "
                                                  "--json is English)"),
    as_json: bool = typer.Option(False, "--json", help="print answer and citations as JSON"),
):
    """Answer from the indexed sources, citing file and line; says so when nothing supports an answer."""
    from opforge.llm.config import load_config
    from opforge.skills.helper import ask, grounded, index

    try:
        set_language("en" if as_json else lang)
        cfg = None if no_model else load_config(llm_config, required=bool(llm_config))
        db = index.open_index(index_path or index.default_path())
        wanted = [c.strip() for c in corpus.split(",") if c.strip()]
        known = index.corpora(db)
        for name in wanted:
            if name not in known:
                raise InputError("--corpus", f"{name!r} is not indexed (indexed: {', '.join(sorted(known))})")
    except InputError as exc:
        _fail(exc, as_json)
    found = ask.search(db, question, k=k, corpora=wanted or None)
    found["answer"] = ask.answer_text(found)
    if cfg is not None and found["supported"]:
        by_model = grounded.answer(cfg, question, found["citations"])
        found["model"] = {**cfg.public(), **by_model}
        if "error" not in by_model:
            found["answer"] = by_model["answer"]
    if run:
        code = ask.snippet_for(found["citations"][0]) if found["citations"] else None
        found["run"] = ask.run_snippet(code, timeout) if code else {"code": None, "output": "no runnable code "
                                                                    "in the answer (torch-npu is read, not run)"}
    if as_json:
        typer.echo(json.dumps(found, indent=1))
        return
    if "error" in found.get("model", {}):
        typer.echo(_("(the model's answer was set aside: {error})").format(error=found["model"]["error"]))
    typer.echo(found["answer"])
    for n, c in enumerate(found["citations"], 1):
        typer.echo(f"  [{n}] {c['corpus']}: {c['path']}:{c['line']}  {c['symbol']}")
    if run:
        typer.echo("\n" + _("$ python -c <the answer's code>") + "\n" + found["run"]["output"].rstrip())


@helper_app.command("eval")
def eval_command(
    qa: Path = typer.Argument(..., help="a question set: a YAML list of {id, topic, question, expect}"),
    k: int = typer.Option(3, "--k", min=1, help="citations looked at"),
    index_path: Path = typer.Option(None, "--index", help=_INDEX_HELP),
    as_json: bool = typer.Option(False, "--json", help="print the whole evaluation as JSON"),
):
    """Top-1 and top-3 citation accuracy and answer accuracy on a question set."""
    from opforge.skills.helper import index
    from opforge.skills.helper.evaluate import evaluate, load

    try:
        items = load(qa)
        db = index.open_index(index_path or index.default_path())
    except InputError as exc:
        _fail(exc, as_json)
    with Progress(TextColumn("asking"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  console=Console(stderr=True), transient=True, disable=as_json) as bar:
        task = bar.add_task("ask", total=len(items))
        result = evaluate(db, items, k=k, progress=lambda: bar.update(task, advance=1))
    if as_json:
        typer.echo(json.dumps(result, indent=1))
        return
    for r in result["rows"]:
        if not r["answer_right"]:
            typer.echo(f"  miss {r['id']}: {r['question'][:90]}  -> {r['cited'][:1] or 'refused'}")
    typer.echo(f"{result['questions']} questions ({result['unanswerable']} without support): top-1 "
               f"{result['top1']:.0%}, top-3 {result['top3']:.0%}, answers right {result['answer']:.0%}; "
               f"median {result['median_s'] * 1000:.0f} ms a question, slowest {result['max_s'] * 1000:.0f} ms")
