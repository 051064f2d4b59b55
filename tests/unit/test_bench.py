"""The pure parts of the bench: its arithmetic and its report."""

from __future__ import annotations

import math

import pytest

from bench.apicost import cumulative
from bench.cluster import schedulable
from bench.run import earlier_tables
from bench.scheduler import order
from bench.stats import (
    added_per_event,
    bucket_bound,
    difference,
    histogram,
    paired_ratios,
    percentile,
    rate,
    ratio,
    span_rate,
    spread,
)
from bench.table import Row, Table, added, number, render_results, render_table

METRICS = """\
# HELP berth_webhook_request_duration_seconds Time to answer a pod admission review.
# TYPE berth_webhook_request_duration_seconds histogram
berth_webhook_request_duration_seconds_bucket{le="0.005"} 90.0
berth_webhook_request_duration_seconds_bucket{le="0.01"} 98.0
berth_webhook_request_duration_seconds_bucket{le="0.025"} 100.0
berth_webhook_request_duration_seconds_bucket{le="+Inf"} 100.0
berth_webhook_request_duration_seconds_count 100.0
berth_webhook_request_duration_seconds_sum 0.4
# HELP berth_webhook_requests_total Pod admission reviews answered.
# TYPE berth_webhook_requests_total counter
berth_webhook_requests_total{result="skipped"} 100.0
"""


@pytest.mark.parametrize(
    ("values", "share", "expected"),
    [
        ([3.0], 0.5, 3.0),
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5),
        ([4.0, 1.0, 3.0, 2.0], 0.0, 1.0),
        ([4.0, 1.0, 3.0, 2.0], 1.0, 4.0),
        (list(map(float, range(101))), 0.99, 99.0),
        ([10.0, 20.0], 0.95, 19.5),
    ],
)
def test_percentile_interpolates_between_ranks(
    values: list[float], share: float, expected: float
) -> None:
    assert percentile(values, share) == pytest.approx(expected)


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 0.5)


def test_rates_and_ratios() -> None:
    assert rate(100, 2.0) == 50.0
    assert rate(100, 0.0) == 0.0
    assert ratio(50.0, 100.0) == 0.5
    assert ratio(50.0, 0.0) is None


def test_the_time_added_to_each_event_is_the_difference_of_the_inverse_rates() -> None:
    assert added_per_event(200.0, 250.0) == pytest.approx(0.001)
    assert added_per_event(250.0, 200.0) == pytest.approx(-0.001)
    assert added_per_event(0.0, 250.0) is None
    assert added(0.00162, "pod") == " (+1.62 ms a pod)"
    assert added(-0.0004, "pod") == " (-0.40 ms a pod)"
    assert added(None, "pod") == ""


def test_span_rate_starts_the_clock_at_the_first_event() -> None:
    assert span_rate([12.0, 10.0, 11.0, 14.0]) == (3, 4.0)
    assert span_rate([5.0]) == (0, 0.0)
    assert span_rate([]) == (0, 0.0)


def test_histogram_reads_the_buckets_of_one_metric() -> None:
    buckets = histogram(METRICS, "berth_webhook_request_duration_seconds")
    assert buckets == {0.005: 90.0, 0.01: 98.0, 0.025: 100.0, math.inf: 100.0}
    with pytest.raises(KeyError):
        histogram(METRICS, "berth_extender_request_duration_seconds")


def test_difference_is_what_was_observed_between_two_reads() -> None:
    before = {0.005: 10.0, 0.01: 10.0, math.inf: 12.0}
    after = {0.005: 15.0, 0.01: 20.0, math.inf: 22.0}
    assert difference(after, before) == {0.005: 5.0, 0.01: 10.0, math.inf: 10.0}


@pytest.mark.parametrize(
    ("share", "bound"),
    [(0.5, 0.005), (0.9, 0.005), (0.95, 0.01), (0.99, 0.025), (1.0, 0.025)],
)
def test_bucket_bound_is_the_bucket_holding_the_quantile(share: float, bound: float) -> None:
    buckets = histogram(METRICS, "berth_webhook_request_duration_seconds")
    assert bucket_bound(buckets, share) == bound


def test_bucket_bound_of_an_empty_histogram_is_none() -> None:
    assert bucket_bound({0.005: 0.0, math.inf: 0.0}, 0.5) is None
    assert bucket_bound({}, 0.5) is None


def test_a_quantile_past_every_finite_bucket_is_infinite() -> None:
    assert bucket_bound({0.005: 1.0, math.inf: 10.0}, 0.99) == math.inf


def test_batches_alternate_abba() -> None:
    assert order(8) == [True, False, False, True, True, False, False, True]
    assert order(4).count(True) == order(4).count(False)


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (1234.5, "pods/s", "1,234 pods/s"),
        (123.4, "", "123"),
        (12.34, "s", "12.3 s"),
        (1.234, "ms", "1.23 ms"),
    ],
)
def test_numbers_keep_about_three_digits(value: float, unit: str, text: str) -> None:
    assert number(value, unit) == text


def test_a_table_has_a_column_per_figure_and_escapes_pipes() -> None:
    table = Table(
        title="Scheduler throughput",
        method="How.",
        rows=[Row("500 nodes", "100 pods/s", "200 pods/s", 0.5, "4 batches", "a | b")],
    )
    assert render_table(table).splitlines() == [
        "## Scheduler throughput",
        "",
        "How.",
        "",
        "| measure | with Berth | without | ratio | n | what this measures |",
        "|---|---|---|---|---|---|",
        "| 500 nodes | 100 pods/s | 200 pods/s | 0.50 | 4 batches | a \\| b |",
    ]


def test_a_table_without_comparison_leaves_those_columns_out() -> None:
    table = Table(
        title="Arbitration",
        method="How.",
        rows=[Row("steady round", "80 ms", n="7 rounds", what="a round")],
        figure_header="time",
        baseline_header=None,
        ratio_header=None,
    )
    lines = render_table(table).splitlines()
    assert lines[4] == "| measure | time | n | what this measures |"
    assert lines[6] == "| steady round | 80 ms | 7 rounds | a round |"


def test_a_missing_ratio_shows_as_a_dash() -> None:
    table = Table(title="T", method="M", rows=[Row("m", "1", "0", None, "1", "w")])
    assert render_table(table).splitlines()[-1] == "| m | 1 | 0 | — | 1 | w |"


def test_the_results_page_describes_the_machine_then_every_table() -> None:
    tables = [Table(title="A", method="a"), Table(title="B", method="b")]
    page = render_results(
        machine=[("cores", "2"), ("git commit", "abc")], notes=["Scale small."], tables=tables
    )
    assert page.startswith("# Benchmark results\n")
    assert "- **cores**: 2\n- **git commit**: abc\n\nScale small.\n" in page
    assert page.index("## A") < page.index("## B")


def test_rows_of_one_family_measured_at_two_sizes_make_one_table() -> None:
    from bench.run import merge

    first = Table(title="Scheduler", method="m", rows=[Row("500 nodes", "1")])
    other = Table(title="Creation", method="c", rows=[Row("1 client", "2")])
    second = Table(title="Scheduler", method="m", rows=[Row("2,000 nodes", "3")])
    merged = merge([first, other, second])
    assert [t.title for t in merged] == ["Scheduler", "Creation"]
    assert [r.measure for r in merged[0].rows] == ["500 nodes", "2,000 nodes"]


def test_a_family_that_failed_keeps_its_failure_in_the_merged_table() -> None:
    from bench.run import merge

    ok = Table(title="Scheduler", method="m", rows=[Row("500 nodes", "1")])
    failed = Table(title="Scheduler", method="m\n\n**Failed**: timed out")
    assert "**Failed**: timed out" in merge([ok, failed])[0].method


@pytest.mark.parametrize(
    ("conditions", "taints", "expected"),
    [
        ([{"type": "Ready", "status": "True"}], [], True),
        ([{"type": "Ready", "status": "False"}], [], False),
        ([], [], False),
        (
            [{"type": "Ready", "status": "True"}],
            [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}],
            False,
        ),
        (
            [{"type": "Ready", "status": "True"}],
            [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
            True,
        ),
    ],
)
def test_a_new_node_counts_once_ready_and_untainted(
    conditions: list[dict[str, str]], taints: list[dict[str, str]], expected: bool
) -> None:
    node = {
        "metadata": {"name": "n"},
        "spec": {"taints": taints},
        "status": {"conditions": conditions},
    }
    assert schedulable(node) is expected


def test_each_note_is_a_paragraph_of_its_own() -> None:
    page = render_results(machine=[("cores", "2")], notes=["One.", "Two."], tables=[])
    assert "- **cores**: 2\n\nOne.\n\nTwo.\n" in page


def test_each_pair_of_batches_is_a_trial_with_its_own_ratio() -> None:
    # ABBA: with, without, without, with.
    runs = [(True, 90.0), (False, 100.0), (False, 50.0), (True, 55.0)]
    assert paired_ratios(runs) == pytest.approx([0.9, 1.1])
    assert spread(paired_ratios(runs)) == "2 pairs: ratios 0.90 to 1.10"
    assert spread([0.5]) == "1 pair: ratio 0.50"
    assert spread([]) == "no pair measured"
    # A pair whose baseline measured nothing has no ratio.
    assert paired_ratios([(True, 1.0), (False, 0.0)]) == []


@pytest.mark.parametrize(
    "runs",
    [[(True, 1.0)], [(True, 1.0), (True, 2.0)]],
    ids=["odd", "one side twice"],
)
def test_batches_that_make_no_pairs_are_an_error(runs: list[tuple[bool, float]]) -> None:
    with pytest.raises(ValueError, match="pair"):
        paired_ratios(runs)


def test_a_partial_run_keeps_the_other_tables_of_the_earlier_page() -> None:
    earlier = render_results(
        machine=[("date", "2026-01-01 10:00 UTC"), ("git commit", "abc")],
        notes=[],
        tables=[
            Table(title="Scheduler throughput", method="m", rows=[Row("a", "1")]),
            Table(title="Memory", method="m2", rows=[Row("b", "2")]),
        ],
    )
    origin, kept = earlier_tables(earlier, {"Scheduler throughput"})
    assert origin == "2026-01-01 10:00 UTC, commit abc"
    [memory] = kept
    assert memory.startswith("## Memory\n\n*Not measured in this run (`--only`): kept from the ")
    assert "| b | 2 |" in memory
    # Kept again by a later partial run: it keeps its own origin, marked once.
    again = render_results(machine=[("date", "later")], notes=[], tables=[]) + "\n" + memory
    _, [still] = earlier_tables(again, {"Scheduler throughput"})
    assert still == memory


def test_cumulative_reads_each_functions_seconds_from_pprofs_top() -> None:
    top = """File: kcp
Type: cpu
      flat  flat%   sum%        cum   cum%
         0     0%     0%      4.50s 33.89%  k8s.io/apiserver/finisher.finishRequest.func1
     0.01s 0.075% 0.075%      3.15s 23.72%  net/http.HandlerFunc.ServeHTTP
    10ms 0.08%  0.15%      250ms  1.90%  runtime.spanClass.sizeclass (inline)
"""
    assert cumulative(top) == {
        "k8s.io/apiserver/finisher.finishRequest.func1": 4.5,
        "net/http.HandlerFunc.ServeHTTP": 3.15,
        "runtime.spanClass.sizeclass (inline)": 0.25,
    }
