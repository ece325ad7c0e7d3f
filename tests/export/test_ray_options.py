"""`emoreward serve --engine ray` options -> Ray Serve deployment options (no Ray needed): fixed replicas or
autoscaling bounds, each replica's CPUs / GPUs, and the refusals that come before any cluster starts."""

import argparse

import pytest

from emoreward.cli.serve import add_arguments
from emoreward.export.serve.ray import MAX_ONGOING_REQUESTS, deployment_options, run_ray_serve


def parse(*argv):
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["--model", "m", *argv])


def test_defaults_are_the_single_process_server():
    assert parse().engine == "single"


def test_fixed_replicas_and_actor_options():
    options = deployment_options(parse("--engine", "ray", "--replicas", "3", "--num-gpus", "1", "--num-cpus", "2"))
    assert options["num_replicas"] == 3 and "autoscaling_config" not in options
    assert options["ray_actor_options"] == {"num_cpus": 2.0, "num_gpus": 1.0}
    assert options["max_ongoing_requests"] == MAX_ONGOING_REQUESTS


def test_autoscaling_bounds():
    options = deployment_options(parse("--engine", "ray", "--min-replicas", "0", "--max-replicas", "8"))
    assert "num_replicas" not in options
    assert options["autoscaling_config"] == {
        "min_replicas": 0,
        "max_replicas": 8,
        "initial_replicas": 1,
        "target_ongoing_requests": 64.0,
    }
    with pytest.raises(ValueError, match="--min-replicas 4 must be between 0 and --max-replicas 2"):
        deployment_options(parse("--engine", "ray", "--min-replicas", "4", "--max-replicas", "2"))


def test_refusals_come_before_ray_starts():
    with pytest.raises(ValueError, match="fixed --port"):
        run_ray_serve(parse("--engine", "ray", "--port", "0"), {}, None)
    with pytest.raises(ValueError, match="must be between"):
        run_ray_serve(
            parse("--engine", "ray", "--port", "8123", "--min-replicas", "3", "--max-replicas", "1"), {}, None
        )
