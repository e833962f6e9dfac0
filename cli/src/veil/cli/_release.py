"""`veil release`: release a table of records you hold so that no one can be re-identified.

    veil release pram     post-randomize key variables with identification risk <= xi (Nayak, Zhang & You)
    veil release dp-pram  epsilon-DP PRAM of categorical columns, most informative keep-probabilities (004)
    veil release mask     Warner masking of 0/1 columns, with unbiased estimates (Kim, 002)
    veil release example  write the synthetic population docs/release-example.md and the tests use

Each reads a CSV file (a header row, then one row per record), writes the released CSV with the
same columns in the same order, and can write a JSON report. The report describes the original
table (it is for the data holder, not for publication) and never holds the seed: a seed replays
the release, so keep it secret; without --seed a fresh seed comes from the OS CSPRNG.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

_PARTITION_HELP = """\
partition syntax (--partition): one item per variable, joined by ';'
  sex                       keep sex unchanged (every value its own group)
  age=0-17,18-24,25-44,45-64,65-
                            numeric ranges LO-HI (inclusive) and LO- (LO and above): age stays in its range
  race=White,Black,*        White, Black, and '*' = every other value together
  marital=never married,married|widowed|divorced|separated
                            groups joined by ',', values within a group by '|'
A post-randomized variable (a key or an --also column) that is not named may change freely. A
token that is a value of the column is that value, even if it looks like a range; every value of
a named variable must fall in exactly one group.

example:
  veil release example --output population.csv
  veil release pram --input population.csv --keys age,sex,race,marital,area \\
      --partition 'sex;age=0-17,18-24,25-34,35-44,45-54,55-64,65-;race=White,Black,*' \\
      --xi 0.395 --output released.csv --report report.json

Goals (Nayak, Zhang & You 2018, sec. 4.2): 1 bounds the chance that a unique match of a
sample-unique person is correct; 2 bounds every unique match; 3 (default) bounds every match.
xi: Goal 1 takes 0 < xi < 1, Goals 2-3 take 1/3 < xi < 1 (0.35 or more keeps blocks <= 20 cells).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    methods = parser.add_subparsers(dest="release_command", metavar="METHOD", required=True)

    pram = methods.add_parser(
        "pram",
        help="post-randomize key variables so every match is correct with probability <= xi",
        description="Post-randomize the key variables of a table by inverse-frequency PRAM in blocks of rare "
        "cells, so that an intruder who knows a person's key values matches them correctly with "
        "probability at most xi (Nayak, Zhang & You's 4-step procedure).",
        epilog=_PARTITION_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _io(pram)
    pram.add_argument("--keys", required=True, metavar="COLS", help="the key variables, comma-separated")
    pram.add_argument(
        "--also",
        default="",
        metavar="COLS",
        help="non-key columns to post-randomize jointly with the keys (their joint counts stay unbiased)",
    )
    pram.add_argument(
        "--partition",
        default="",
        metavar="SPEC",
        help="category merges X* that records never leave (see below); default: none",
    )
    level = pram.add_mutually_exclusive_group(required=True)
    level.add_argument("--xi", type=float, help="the bound on a correct match's probability")
    level.add_argument("--theta", type=float, help="IFPR's parameter instead of xi (0 < theta < 1)")
    pram.add_argument("--goal", type=int, choices=(1, 2, 3), default=3, help="which risks xi bounds (default 3: all)")
    pram.add_argument(
        "--split-blocks",
        action="store_true",
        help="split large blocks at random into blocks of near the minimum size (less variance)",
    )
    pram.add_argument(
        "--show",
        default=None,
        metavar="COLS",
        help="variables whose before/after counts to print (default: those with at most 12 values)",
    )

    dp = methods.add_parser(
        "dp-pram",
        help="epsilon-DP PRAM of categorical columns with the most informative keep-probabilities",
        description="Release each named column by PRAM that is epsilon-differentially private, with the "
        "keep-probabilities that maximise the mutual information between true and released values "
        "(Ayed, Battiston & Camerlenghi).",
        epilog="example:\n  veil release dp-pram --input population.csv --columns marital --epsilon 1 \\\n"
        "      --domain 'marital=married,widowed,divorced,separated,never married' --output released.csv\n\n"
        "Columns are released independently: a record's released values are (columns x epsilon)-DP "
        "together.\n--prior data optimises for the column's own shares (as the paper does; that choice "
        "reads the data\noutside the DP guarantee); --prior uniform gives k-ary randomized response and "
        "reads nothing.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _io(dp)
    dp.add_argument("--columns", required=True, metavar="COLS", help="the columns to release, comma-separated")
    dp.add_argument("--epsilon", type=float, required=True, help="privacy level of each column (above 0)")
    dp.add_argument(
        "--domain",
        default="",
        metavar="SPEC",
        help="each column's categories: 'col=a,b,c;col2=x,y' (default: the values present)",
    )
    dp.add_argument(
        "--prior",
        choices=("data", "uniform"),
        default="data",
        help="the marginal the keep-probabilities are optimised for (default data)",
    )

    mask = methods.add_parser(
        "mask",
        help="Warner masking of 0/1 columns, with unbiased shares, covariances and correlations",
        description="Mask 0/1 columns by z = x XOR slip, P(slip = 1) = p (Warner; Kim). The report gives the "
        "unbiased shares, covariances and correlations a user can compute from the masked table.",
        epilog="example:\n  veil release mask --input population.csv --columns smoker,insured --p 0.2 "
        "--output masked.csv\n\nBy default the slips are a response population of exactly round(n p) ones "
        "dealt without\nreplacement (Kim's exact scheme); --with-replacement draws them independently.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _io(mask)
    mask.add_argument("--columns", required=True, metavar="COLS", help="the 0/1 columns to mask, comma-separated")
    mask.add_argument(
        "--p",
        required=True,
        metavar="P",
        help="the slip probability: one number for every column, or 'col=0.2,col2=0.3'",
    )
    mask.add_argument("--shared", action="store_true", help="one slip per record for all columns (needs one p)")
    mask.add_argument("--with-replacement", action="store_true", help="independent slips instead of a dealt population")

    example = methods.add_parser(
        "example",
        help="write the synthetic population table of docs/release-example.md and the tests",
        description="Write a seeded synthetic person-level population: sex, age, race, marital, area (the five key "
        "variables), education, work, smoker, insured.",
    )
    example.add_argument("--output", required=True, metavar="CSV", help="where to write the table")
    example.add_argument("--records", type=int, default=60_000, help="how many persons (default 60000)")
    example.add_argument("--seed", type=int, default=2016, help="the generator's seed (default 2016)")


def _io(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, metavar="CSV", help="the original table (CSV with a header row)")
    parser.add_argument("--output", required=True, metavar="CSV", help="where to write the released table")
    parser.add_argument("--report", metavar="JSON", help="where to write the report (for the data holder)")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed the release (reproducible; a secret: it replays the release). Default: from the OS CSPRNG",
    )
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")


def _names(text: str, option: str) -> list[str]:
    from . import CliError

    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names and text.strip():
        raise CliError(f"{option}: no column names in {text!r}.")
    return names


def _write_report(path: str | None, report: dict) -> None:
    if path is None:
        return
    import numpy as np

    from . import CliError

    def plain(x: object) -> object:
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, np.ndarray):
            return x.tolist()
        raise TypeError(type(x).__name__)

    text = json.dumps(report, indent=2, default=plain) + "\n"
    try:
        # Owner-only: the report describes the original records (counts, risks, cells).
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w", encoding="utf-8") as file:
            os.fchmod(fd, 0o600)  # a file that was there keeps its mode otherwise
            file.write(text)
    except OSError as err:
        raise CliError(f"cannot write {path}: {err.strerror or err}.") from None


def _check_paths(args: argparse.Namespace) -> None:
    """Refuse an --output or --report that would overwrite the original (or each other)."""
    from . import CliError

    def same(a: str, b: str) -> bool:
        try:
            return os.path.samefile(a, b)
        except OSError:  # one does not exist yet
            return os.path.realpath(a) == os.path.realpath(b)

    if same(args.output, args.input):
        raise CliError(f"--output {args.output} is the --input file: the original would be overwritten.")
    if args.report is not None and (same(args.report, args.input) or same(args.report, args.output)):
        raise CliError(f"--report {args.report} is the --input or --output file.")


def _table(rows: list[list[str]], right_from: int = 1) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) if i < right_from else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
        for r in rows
    )


def _pram(args: argparse.Namespace) -> int:
    from veil.release import read_csv, release_pram, write_csv

    from . import CliError

    keys, also = _names(args.keys, "--keys"), _names(args.also, "--also")
    show = None if args.show is None else _names(args.show, "--show")
    for c in show or ():
        if c not in keys and c not in also:
            raise CliError(f"--show: column {c!r} is not post-randomized (not in --keys or --also).")
    table = read_csv(args.input)
    release = release_pram(
        table,
        keys,
        also=also,
        partition=args.partition or None,
        xi=args.xi,
        theta=args.theta,
        goal=args.goal,
        split_blocks=args.split_blocks,
        rng=args.seed,
    )
    write_csv(args.output, release.table)
    report = release.report()
    _write_report(args.report, report)
    if args.quiet:
        return 0
    n, cells, blocks, risk = report["records"], report["cells"], report["blocks"], report["guarantee"]
    print(
        f"{n:,} records; post-randomized: {', '.join(report['post_randomized'])}; "
        f"Goal {release.goal} at xi = {release.xi:.4g}"
    )
    print(
        f"theta = {release.theta:.5f}; blocks of at least {release.min_block_cells} cells; "
        f"{report['partition_sets']:,} partition sets, {blocks['count']:,} blocks "
        f"({blocks['cells_min']:,}-{blocks['cells_max']:,} cells)"
    )
    print(
        f"cells: {cells['non_empty']:,} non-empty, {cells['singleton']:,} singletons, {cells['doubleton']:,} "
        f"doubletons; {report['cells_perturbed']:,} cells perturbed; {report['records_changed']:,} records "
        f"changed ({report['records_changed'] / n:.2%})"
    )
    verdict = "all within xi" if risk["holds"] else "ABOVE xi"
    print(
        f"exact risks given the original counts: largest R(1) = {risk['largest_R1']:.5f}, "
        f"R(2) = {risk['largest_R2']:.5f}, unperturbed 1/t = {risk['largest_unperturbed']:.5f}: {verdict}"
    )
    cm, ex = release.correct_match(), release.expected_correct_match()
    print(
        "\nCorrect-match probabilities P(CM | tau, tau*), tau and tau* the size of a unit's key cell before and "
        "after:\nexpected given the original counts (each <= xi)   |  empirical, this release"
    )
    for left, right in zip(ex.format().splitlines(), cm.format().splitlines()):
        print(f"{left}      |  {right}")
    print(
        f"changed: {cm.changed[0]:.2%} of originally unique units (expected {ex.changed[0]:.2%}), "
        f"{cm.changed[1]:.2%} of doubleton units (expected {ex.changed[1]:.2%})"
    )
    print(
        f"no match: {cm.no_match[0]:.2%} of originally unique units (expected {ex.no_match[0]:.2%}), "
        f"{cm.no_match[1]:.2%} of doubleton units (expected {ex.no_match[1]:.2%})"
    )
    if show is None:
        show = [c for c in release.post_randomized if release.categories[c].size <= 12]
    for c in show:
        rows = report["marginals"][c]
        out = [[c, "original", "released", "difference", "sampling SD", "perturbation SD"]]
        for r in rows:
            out.append(
                [
                    r["category"],
                    f"{r['original']:,} ({r['original_share']:.4f})",
                    f"{r['released']:,} ({r['released_share']:.4f})",
                    f"{r['difference']:,}",
                    f"{r['sampling_sd']:.2f}",
                    f"{r.get('perturbation_sd', 0.0):.2f}",
                ]
            )
        print()
        print(_table(out))
    tvd = report["total_variation_distance"]
    print(
        "\ntotal variation distance, original vs released: "
        + ", ".join(
            f"{k} {v:.4f}" for k, v in tvd.items() if "," not in k or k.count(",") == len(release.post_randomized) - 1
        )
    )
    print(f"\nwrote {args.output}" + (f" and {args.report}" if args.report else ""))
    return 0


def _domain(text: str) -> dict[str, list[str]]:
    from . import CliError

    out: dict[str, list[str]] = {}
    for item in text.split(";"):
        if not item.strip():
            continue
        name, eq, values = item.partition("=")
        name = name.strip()
        cats = [v.strip() for v in values.split(",") if v.strip()]
        if not eq or not name or not cats:
            raise CliError(f"--domain: expected 'column=value,value,...', not {item.strip()!r}.")
        if name in out:
            raise CliError(f"--domain: column {name!r} is named twice.")
        out[name] = cats
    return out


def _dp(args: argparse.Namespace) -> int:
    from veil.release import read_csv, release_dp_pram, write_csv

    columns = _names(args.columns, "--columns")
    table = read_csv(args.input)
    release = release_dp_pram(
        table, columns, args.epsilon, domain=_domain(args.domain), prior=args.prior, rng=args.seed
    )
    write_csv(args.output, release.table)
    report = release.report()
    _write_report(args.report, report)
    if args.quiet:
        return 0
    for c, col in report["columns"].items():
        levels = ", ".join(f"{k} x {v}" for k, v in col["levels"].items())
        print(
            f"{c}: epsilon = {col['epsilon']:g}, {len(col['categories'])} categories; keep-probabilities {levels} "
            f"({col['search']}{'' if col['exact_optimum'] else ', not certified optimal'}); "
            f"I(X;Z) = {col['mutual_information_nats']:.4f} nats; parity {col['parity']:.6g} <= e^epsilon = "
            f"{col['e_epsilon']:.6g}"
        )
        rows = [[c, "keep", "original", "released", "MLE", "sampling SD"]]
        for i, cat in enumerate(col["categories"]):
            rows.append(
                [
                    cat,
                    f"{col['keep_probability'][i]:.4f}",
                    f"{col['original'][i]:,}",
                    f"{col['released'][i]:,}",
                    f"{col['mle'][i]:,.1f}",
                    f"{col['sampling_sd'][i]:.2f}",
                ]
            )
        print(_table(rows))
        print()
    print(
        f"a record's released values are {report['epsilon_per_record']:g}-DP together; wrote {args.output}"
        + (f" and {args.report}" if args.report else "")
    )
    return 0


def _p_values(text: str, columns: list[str]) -> float | dict[str, float]:
    from . import CliError

    def number(s: str) -> float:
        try:
            return float(s)
        except ValueError:
            raise CliError(f"--p: {s.strip()!r} is not a number.") from None

    if "=" not in text:
        return number(text)
    out: dict[str, float] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, _, value = item.partition("=")
        out[name.strip()] = number(value)
    return out


def _mask(args: argparse.Namespace) -> int:
    from veil.release import read_csv, release_mask, write_csv

    columns = _names(args.columns, "--columns")
    table = read_csv(args.input)
    release = release_mask(
        table, columns, _p_values(args.p, columns), shared=args.shared, replacement=args.with_replacement, rng=args.seed
    )
    write_csv(args.output, release.table)
    report = release.report()
    _write_report(args.report, report)
    if args.quiet:
        return 0
    rows = [["column", "p", "original", "released", "estimate", "masking SE", "SE with sampling"]]
    for c, col in report["columns"].items():
        rows.append(
            [
                c,
                f"{col['p']:.4f}",
                f"{col['original_share']:.4f}",
                f"{col['released_share']:.4f}",
                f"{col['estimate']:.4f}",
                f"{col['masking_se']:.4f}",
                f"{col['se_with_sampling']:.4f}",
            ]
        )
    print(
        f"{report['records']:,} records; slips {next(iter(report['columns'].values()))['slips']}"
        + ("; one shared slip per record" if args.shared else "")
    )
    print(_table(rows))
    if report["pairs"]:
        rows = [["pair", "covariance", "estimate", "correlation", "estimate", "naive on released"]]
        for pair in report["pairs"]:
            corr = pair["original_correlation"]
            rows.append(
                [
                    ",".join(pair["columns"]),
                    f"{pair['original_covariance']:.5f}",
                    f"{pair['estimated_covariance']:.5f}",
                    "-" if corr is None else f"{corr:.4f}",
                    f"{pair['estimated_correlation']:.4f}",
                    f"{pair['naive_correlation_of_released']:.4f}",
                ]
            )
        print()
        print(_table(rows))
    print(f"\nwrote {args.output}" + (f" and {args.report}" if args.report else ""))
    return 0


def _example(args: argparse.Namespace) -> int:
    import numpy as np

    from veil.release import synthetic_population, write_csv

    from . import CliError

    if args.records < 1 or args.seed < 0:
        raise CliError("--records must be at least 1 and --seed at least 0.")
    table = synthetic_population(args.records, rng=args.seed)
    write_csv(args.output, table)
    keys = ["age", "sex", "race", "marital", "area"]
    codes = np.stack([np.unique(table[k], return_inverse=True)[1].reshape(-1) for k in keys], axis=1)
    _, counts = np.unique(codes, axis=0, return_counts=True)
    print(
        f"wrote {args.output}: {args.records:,} persons, columns {', '.join(table)}; the five key variables "
        f"{', '.join(keys)} have {counts.size:,} non-empty cells, {int(np.sum(counts == 1)):,} singletons and "
        f"{int(np.sum(counts == 2)):,} doubletons"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    from veil.release import ReleaseError

    from . import CliError

    handler = {"pram": _pram, "dp-pram": _dp, "mask": _mask, "example": _example}[args.release_command]
    if handler is not _example:
        _check_paths(args)
    try:
        return handler(args)
    except ReleaseError as err:
        raise CliError(str(err)) from None
    except BrokenPipeError:
        raise
    except OSError as err:  # pragma: no cover - read/write errors are ReleaseErrors already
        print(f"veil release: {err}", file=sys.stderr)
        return 2
