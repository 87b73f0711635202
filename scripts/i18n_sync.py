"""Update the translation catalogs (src/opforge/locale/<lang>/<part>.po) from the messages the code marks with
`_()`, `N_()` and `ngettext()`: new messages get an empty entry to translate, messages no longer used are dropped.

    .venv/bin/python scripts/i18n_sync.py [--lang zh] [--part op_perf ...]

Then fill in the empty `msgstr`s; `tests/test_i18n.py` fails while any is empty.
"""

import argparse

from opforge.i18n import LANGUAGES, sync_catalogs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lang", default="zh", choices=[lang for lang in LANGUAGES if lang != "en"])
    ap.add_argument("--part", action="append", help="only this catalog (a skill's folder name, or a package's)")
    args = ap.parse_args()
    for part, counts in sync_catalogs(args.lang, args.part).items():
        print(f"{part}.po: {counts['added']} added, {counts['dropped']} dropped, "
              f"{counts['untranslated']} to translate")


if __name__ == "__main__":
    main()
