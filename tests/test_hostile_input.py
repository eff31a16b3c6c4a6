"""Hostile input at the real command line: every bad override or preset gives one line and no run.

Each case runs `python -m ampgan.train ...` in a subprocess (two at a time) with its own
AMPGAN_OUTPUTS, and must end with exactly one stderr line `ampgan: error: ...`, exit code 2,
no traceback, no MLflow run (none RUNNING) and no run folder. The preflight's sweep
expansion is tested directly below (presets' sweeps, huge sweeps, glob, interval, threads).
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ampgan import MAX_ERROR_LINE, AmpganError, error_line, one_line, report_error
from ampgan.config.preflight import check
from tests.conftest import all_runs, run_cli

LONG = "x" * 10000
DIGITS = "9" * 10000

# name: (command-line words, a fragment the error line must contain). Run as real subprocesses.
CASES: dict[str, tuple[list[str], str]] = {
    # wrong types
    "text for an int": (["trainer.batch_size=abc"], "trainer.batch_size=abc: Value 'abc'"),
    "float for an int": (["trainer.max_steps=1.5"], "trainer.max_steps=1.5"),
    "word for a bool": (["hardware.jit=maybe"], "hardware.jit=maybe"),
    "text inside a float pair": (["model.betas=[a,0.9]"], "model.betas"),
    "string for a list": (["amp.keep_fp32=Dense"], "amp.keep_fp32"),
    "null for an int": (["data.seed=null"], "data.seed"),
    "dict for an int": (["model.hidden={a:1}"], "model.hidden"),
    # out-of-range numbers
    "zero steps": (["trainer.max_steps=0"], "trainer.max_steps must be >= 1"),
    "batch of one": (["trainer.batch_size=1"], "trainer.batch_size must be >= 2"),
    "nan scale": (["scaler=dynamic", "scaler.init_scale=nan"], "scaler.init_scale"),
    "infinite learning rate": (["model.lr_g=inf"], "model.lr_g=inf: must be a finite number"),
    "negative penalty": (["model.gp_lambda=-0.1"], "model.gp_lambda must be >= 0"),
    "three betas": (["model.betas=[0.5,0.9,0.99]"], "model.betas must be two numbers"),
    "test fraction one": (["data.test_fraction=1"], "data.test_fraction must lie in (0, 1)"),
    "seed past 2**32": (["trainer.seed=4294967296"], "trainer.seed must lie in 0 .. 2**32-1"),
    "no checkpoints kept": (["trainer.keep_checkpoints=0"], "trainer.keep_checkpoints must be >= 1"),
    "zero heartbeat": (["tracking.heartbeat_seconds=0"], "tracking.heartbeat_seconds must be > 0"),
    "ceiling under the start": (["scaler=underflow_aware", "scaler.max_scale=1"], "scaler.max_scale"),
    "data set beyond memory": (["data.n_train=1000000000000000"], "generating the set needs"),
    "absurd width": (["model.hidden=100000"], "model.hidden must lie in 1 .. 16384"),
    # unknown keys and groups
    "mistyped key": (["trainer.max_step=5"], "trainer.max_step=5: no key 'max_step' in trainer (did you mean max_steps?)"),
    "mistyped group": (["modle=classifier"], "no key 'modle' at the top level (did you mean model?)"),
    "added top-level key": (["+foo=1"], "no group or key 'foo' at the top level"),
    "added unknown key": (["+trainer.foo=1"], "no key 'foo' in trainer"),
    "key of another scaler": (["scaler.init_scale=-1"], "no key 'init_scale' in scaler"),
    "unknown amp level": (["amp=o9"], "amp=o9: no such option"),
    "mistyped option": (["scaler=dynamc"], "scaler=dynamc: no such option (did you mean dynamic?)"),
    "unknown preset": (["+experiment=nope"], "+experiment=nope: no such option"),
    "preset without +": (["experiment=scaler_study"], "add it with +experiment="),
    "unknown launcher": (["hydra/launcher=nope"], "hydra/launcher=nope: no such option"),
    "model renamed under its option": (["model.name=classifier"], "choose the option instead (model=classifier)"),
    "group deleted": (["~model"], "config has no 'model' group"),
    "unknown flag": (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    "unreadable override": (["trainer.max_steps=("], "not an override Hydra can read"),
    # empty and huge strings, unicode
    "empty amp level": (["amp.level="], "amp.level must be one of"),
    "empty experiment": (["tracking.experiment="], "tracking.experiment must be 1 to 500 characters"),
    "huge experiment name": ([f"tracking.experiment={LONG}"], "tracking.experiment must be 1 to 500 characters"),
    "huge option name": ([f"scaler={LONG}"], "no such option"),
    "10000-digit batch": ([f"trainer.batch_size={DIGITS}"], "a number of more than 4300 digits"),
    "unquoted unicode": (["data=数字"], "quote a value"),
    "quoted unicode option": (["data='数字'"], "data='数字': no such option"),
    "unicode level": (["amp.level='Ö2'"], "amp.level must be one of"),
    # tracking store
    "relative sqlite path": (["tracking.uri=sqlite:///relative.db"], "absolute sqlite path"),
    # sweeps with one bad member
    "bad window in a sweep": (["-m", "scaler=dynamic", "scaler.window=10,0"], "scaler.window must be >= 1"),
    "bad option in a sweep": (["-m", "amp=o0,o9"], "amp=o9: no such option"),
    "fp32_loss off across models": (["-m", "model=wgan_gp,classifier", "data=digits", "amp.fp32_loss=false"],
                                    "amp.fp32_loss=false with model=wgan_gp"),
    "glob of scalers without health": (["-m", "scaler=glob(*)", "trainer.grad_health=false"], "reads gradient health"),
    "range through zero": (["-m", "trainer.max_steps=range(-1,3)"], "trainer.max_steps must be >= 1"),
    "threads swept in one process": (["-m", "hardware.threads=1,2"], "hardware.threads takes 2 values"),
    "two jobs resume one run": (["-m", "trainer.resume=0123456789abcdef0123456789abcdef", "scaler=static,dynamic"],
                                "would resume the same run"),
    "bad member past the 256th job": (["-m", "trainer.max_steps=range(300,-1,-1)", "trainer.seed=0,1"],
                                      "trainer.max_steps must be >= 1, got 0"),
    "sweep without -m": (["scaler.window=10,0"], "needs --multirun"),
    # interval() where it makes no sense
    "interval with the basic sweeper": (["-m", "trainer.seed=interval(0,10)"], "interval() needs a search sweeper"),
    "interval over a group": (["-m", "amp=interval(0,1)"], "not an interval"),
    # batch bigger than the data
    "batch bigger than digits": (["model=classifier", "data=digits", "trainer.batch_size=2000"],
                                 "is larger than the 1438 training samples of data=digits"),
    "data smaller than the batch": (["data.n_train=100"], "trainer.batch_size=256 is larger than the"),
    # bad presets and combinations
    "preset sweep without health": (["+experiment=scaler_study", "trainer.grad_health=false"], "reads gradient health"),
    "classifier preset on the swiss roll": (["+experiment=classifier_digits", "data=swissroll"], "no class labels"),
    "image preset in pynative": (["+experiment=wgan_digits", "hardware.jit=false"], "PYNATIVE"),
    "penalty flag on the classifier preset": (["+experiment=classifier_digits", "amp.fp32_gradient_penalty=true"],
                                              "amp.fp32_gradient_penalty=true with model=classifier"),
    "missing gpu": (["hardware=gpu"], "hardware=gpu"),
    # the last of issue 45: a store MLflow cannot open, a long list of presets, numbers no run reaches
    "store of an unknown scheme": (["tracking.uri=ftp://x"], "tracking.uri=ftp://x: MLflow has no tracking store for 'ftp:'"),
    "unknown preset among many": (["+experiment=nosuchexperiment"], "choose from the"),
    "steps no run reaches": (["trainer.max_steps=99999999999999999999"], "trainer.max_steps must be at most 10**9"),
    "steps one past the bound": (["trainer.max_steps=1_000_000_001"], "no run gets that far"),
    "batch beyond memory for a model's own data": (["model=lm", "trainer.batch_size=1000000000000"],
                                                   "is larger than any data set this machine holds"),
    "batch beyond a custom data set's memory": (["data=custom", "data.source._target_=numpy.zeros",
                                                 "trainer.batch_size=1000000000000"], "larger than any data set"),
    "huge sweep value past the step bound": (["-m", "trainer.max_steps=5,2000000000"],
                                             "(in the sweep's job trainer.max_steps=2000000000)"),
    "huge unknown key": ([f"trainer.{LONG}=1"], "[cut; the whole message is in "),
    "unknown key of hydra's": (["hydra.nosuchkey=1"], "hydra.nosuchkey=1: no key 'nosuchkey' in hydra"),
}

# More of the same kind, checked in-process (the preflight's `check`, as the command line calls it).
CHECK_CASES: dict[str, tuple[list[str], str]] = {
    "float factor": (["scaler=dynamic", "scaler.factor=2.5"], "scaler.factor"),
    "list for a bool": (["trainer.grad_health=[true]"], "trainer.grad_health"),
    "negative steps": (["trainer.max_steps=-5"], "trainer.max_steps must be >= 1"),
    "zero static scale": (["scaler=static", "scaler.init_scale=0"], "scaler.init_scale"),
    "beta of one": (["model.betas=[0.5,1.0]"], "model.betas must lie in [0, 1)"),
    "tiny data set": (["data.n_train=8"], "data.n_train must be >= 16"),
    "negative seed": (["trainer.seed=-1"], "trainer.seed must lie in 0 .. 2**32-1"),
    "few eval samples": (["trainer.eval_samples=99"], "trainer.eval_samples"),
    "negative print seconds": (["trainer.print_seconds=-1"], "trainer.print_seconds must be >= 0"),
    "zero flush": (["tracking.flush_every=0"], "tracking.flush_every"),
    "zero log cadence": (["trainer.log_every=0"], "trainer.log_every must be >= 1"),
    "negative threads": (["hardware.threads=-2"], "hardware.threads must be >= 0"),
    "threshold above one": (["scaler=underflow_aware", "scaler.underflow_threshold=1.5"], "scaler.underflow_threshold"),
    "odd image size": (["model=classifier", "data=digits", "data.image_size=12"], "data.image_size must be 8 or 16"),
    "10000-digit width": ([f"model.hidden={DIGITS}"], "more than 4300 digits"),
    "option in capitals": (["amp=O2"], "amp=O2: no such option (did you mean o2?)"),
    "unknown data set name": (["data.name=nope"], "unknown data set 'nope'"),
    "override without key": (["=5"], "the override names no key"),
    "unknown cell class": (["amp.keep_fp32=[NotACell]"], "NotACell"),
    "empty device": (["hardware.device="], "hardware.device must be one of"),
    "huge amp level": ([f"amp.level={LONG}"], "amp.level must be one of"),
    "huge batch in range": (["trainer.batch_size=10000000000000000000000000000000"], "training samples"),
    "unicode number": (["trainer.max_steps='五'"], "trainer.max_steps"),
    "unicode key": (["trainer.größe=1"], "quote a value"),
    "not a uri": (["tracking.uri=nope"], "tracking.uri must be a URI"),
    "file store": (["tracking.uri=file:///tmp/mlruns"], "MLFLOW_ALLOW_FILE_STORE"),
    "one batch too big in a sweep": (["-m", "trainer.batch_size=64,100000"], "trainer.batch_size=100000 is larger"),
    "choice with a negative seed": (["-m", "trainer.seed=choice(0,-1)"], "trainer.seed must lie in"),
    "threads swept in joblib workers": (["-m", "hardware.threads=1,2", "hydra/launcher=joblib"], "hardware.threads"),
    "range without -m": (["trainer.seed=range(1,3)"], "a sweep needs --multirun"),
    "test share leaves no batch": (["+experiment=classifier_digits", "data.test_fraction=0.99"], "training samples"),
    "preset sweep with a bad level": (["-m", "+experiment=scaler_study", "amp=o0,o7"], "amp=o7: no such option"),
    "sweep of presets with a bad one": (["-m", "+experiment=wgan_gaussians8,nope"], "+experiment=nope: no such option"),
    "experiment name over MLflow's limit": (["tracking.experiment=" + "e" * 501], "1 to 500 characters"),
    "object store as tracking store": (["tracking.uri=s3://bucket/mlruns"], "no tracking store for 's3:' URIs"),
    "steps far past the bound": (["trainer.max_steps=1000000000000"], "at most 10**9"),
    "batch past the split of a preset": (["+experiment=classifier_digits", "trainer.batch_size=5000"],
                                         "is larger than the 1438 training samples"),
    "misspelt preset among many": (["+experiment=diag_healthz"], "did you mean diag_healthy?"),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Every case, run two at a time (the machine has two cores)."""
    base = tmp_path_factory.mktemp("hostile")
    outs = {name: base / f"case{i}" for i, name in enumerate(CASES)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = dict(zip(CASES, pool.map(lambda name: run_cli(*CASES[name][0], outputs=outs[name]), CASES)))
    return {name: (procs[name], outs[name]) for name in CASES}


def test_at_least_sixty_distinct_cases():
    assert len({tuple(args) for args, _ in CASES.values()}) == len(CASES) >= 60
    assert not {tuple(a) for a, _ in CASES.values()} & {tuple(a) for a, _ in CHECK_CASES.values()}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_input_fails_with_one_line_and_no_run(results, case):
    proc, outputs = results[case]
    fragment = CASES[case][1]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("ampgan: error: "), proc.stderr[-3000:]
    assert fragment in lines[0], lines[0][:500]
    assert len(lines[0]) <= MAX_ERROR_LINE, lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (outputs / "runs").exists() and not (outputs / "multirun").exists()
    logs = sorted((outputs / "errors").glob("*.log"))
    if "[cut; the whole message is in " in lines[0]:  # the line names the one log holding it whole
        assert [str(p) for p in logs] == [lines[0].rsplit(" is in ", 1)[1].rstrip("]")], lines[0]
    else:
        assert logs == []
    if (outputs / "mlflow.db").exists():
        _, runs = all_runs(outputs)
        assert runs == [] and all(r.info.status != "RUNNING" for r in runs)


@pytest.mark.parametrize("case", list(CHECK_CASES))
def test_more_hostile_input_fails_in_preflight_with_one_line(outputs, case):
    args, fragment = CHECK_CASES[case]
    with pytest.raises(AmpganError) as err:
        check(args)
    line = error_line(err.value)
    assert fragment in line and len(line) <= MAX_ERROR_LINE, line[:500]
    assert not outputs.exists() or set(outputs.iterdir()) <= {outputs / "errors"}


# ---------------------------------------------------------------- the preflight's sweeps, directly
def test_preset_sweep_is_expanded_and_checked(outputs):
    """`+experiment=scaler_study` sets its own sweep (hydra.sweeper.params): its jobs are validated."""
    with pytest.raises(AmpganError, match="scaler=underflow_aware reads gradient health"):
        check(["+experiment=scaler_study", "trainer.grad_health=false"])
    assert not (outputs / "mlflow.db").exists()


def test_preset_sweep_creates_the_store_before_its_jobs(outputs):
    check(["+experiment=scaler_study", "trainer=smoke"])
    client, runs = all_runs(outputs)
    assert (outputs / "mlflow.db").exists() and runs == []
    assert "ampgan" in [e.name for e in client.search_experiments()]


def test_command_line_overrides_a_presets_sweep(outputs):
    """Hydra lets `amp=o3` replace the preset's `amp: o0,o2`; the check follows it."""
    seen = set()
    check(["+experiment=scaler_study", "amp=o3", "tracking=none"], extra=lambda cfg: seen.add(cfg.amp.level))
    assert seen == {"O3"}


def test_every_job_of_a_huge_sweep_is_checked(outputs):
    """602 jobs: the bad member is job 601 (the old check stopped at 256 without a word)."""
    with pytest.raises(AmpganError, match="trainer.max_steps must be >= 1, got 0"):
        check(["-m", "trainer.max_steps=range(300,-1,-1)", "trainer.seed=0,1", "tracking=none"])


def _jobs_checked(words: list[str]) -> int:
    """How many jobs the preflight composes and validates for a sweep."""
    from hydra import initialize_config_dir

    from ampgan.config.schema import CONF_DIR
    from ampgan.config.preflight import _Preflight

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        pf = _Preflight("train", words, True, None)
        pf.dims = pf.sweep_dims(pf.primary())
        return len(pf.jobs_to_check())


def test_huge_sweep_of_independent_keys_is_checked_one_group_at_a_time(outputs):
    """44100 jobs (seed x clip norm x width): each key's values are checked once, 350 jobs in all."""
    words = ["-m", "trainer.seed=range(0,300)", "scaler=fixed_clip", "scaler.clip_norm=1,2,-1", "model.hidden=range(1,50)",
             "tracking=none"]
    assert _jobs_checked(words[1:]) == 1 + 299 + 2 + 48
    with pytest.raises(AmpganError, match="scaler.clip_norm must be a finite number > 0, got -1.0"):
        check(words)


def test_keys_that_interact_are_checked_in_every_combination(outputs):
    """A batch of 1500 fits digits' training split at test_fraction 0.1 (1618 images), not at 0.2 (1438)."""
    words = ["model=classifier", "data=digits", "data.test_fraction=0.1,0.2", "tracking=none"]
    assert _jobs_checked([*words, "trainer.batch_size=64,1500"]) == 4
    check(["-m", *words, "trainer.batch_size=64,1400"])
    with pytest.raises(AmpganError, match="trainer.batch_size=1500 is larger than the 1438"):
        check(["-m", *words, "trainer.batch_size=64,1500"])


def test_a_preset_in_a_sweep_is_combined_with_every_other_key(outputs):
    """A preset can set anything: each swept key is checked with each preset (2x2 + 2x2 jobs, 2 shared);
    the seed and the scaler, which no check reads together, are not combined with each other."""
    words = ["+experiment=classifier_digits,wgan_gaussians8", "trainer.seed=1,2", "scaler=static,dynamic"]
    assert _jobs_checked(words) == 6


def test_a_key_interpolated_into_another_group_is_checked_with_it(outputs):
    """The preset's run_name interpolates ${amp.level}: amp is combined with the tracking keys too."""
    words = ["+experiment=classifier_digits", "amp=o0,o2", "tracking.flush_every=1,2"]
    assert _jobs_checked(words) == 4
    assert _jobs_checked(["amp=o0,o2", "trainer.seed=1,2"]) == 3  # no interpolation, no check joins them


def test_glob_sweeps_the_yaml_options_only(outputs):
    seen = []
    check(["-m", "amp=glob(*)", "tracking=none"], extra=lambda cfg: seen.append(cfg.amp.level))
    assert sorted(seen) == ["O0", "O1", "O2", "O3"]


def test_extra_is_called_on_every_job_and_can_refuse(outputs):
    seen = []
    check(["-m", "scaler=static,dynamic", "trainer.seed=1,2,3", "tracking=none"],
          extra=lambda cfg: seen.append((cfg.scaler.name, cfg.trainer.seed)))
    assert sorted(seen) == sorted((s, n) for s in ("static", "dynamic") for n in (1, 2, 3))

    def refuse(cfg):
        if cfg.trainer.seed == 3:
            raise AmpganError("my tool: seed 3 is not welcome")

    with pytest.raises(AmpganError, match="seed 3 is not welcome"):
        check(["-m", "trainer.seed=1,2,3", "tracking=none"], extra=refuse)


def test_check_takes_the_root_config_name(outputs):
    check(["tracking=none"], config_name="train")
    with pytest.raises(AmpganError, match="nope"):
        check(["tracking=none"], config_name="nope")


def test_interval_end_points_are_checked_with_a_search_sweeper(outputs):
    """With a search sweeper (Optuna's is not installed here: its target is named) interval() is
    allowed and its end points are validated like any value."""
    optuna = "hydra.sweeper._target_=hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    check(["-m", optuna, "model.lr_g=interval(0.0001,0.01)", "tracking=none"])
    with pytest.raises(AmpganError, match="model: learning rates must be > 0, got -0.01"):
        check(["-m", optuna, "model.lr_g=interval(-0.01,0.01)", "tracking=none"])


def test_one_line_cuts_long_words_and_joins_lines():
    text = one_line("a\nb " + "y" * 5000)
    assert "\n" not in text and "(5000 characters)" in text and len(text) < 120


def test_a_long_cause_is_cut_to_the_bound_and_logged_whole(outputs, capsys):
    cause = "\n".join(f"line {i}: the store said something long about what went wrong" for i in range(40))
    err = AmpganError(f"tracking store http://h:5000: {cause}")
    assert report_error(err) == 2
    line = capsys.readouterr().err.rstrip("\n")
    assert "\n" not in line and len(line) <= MAX_ERROR_LINE, line
    assert line.startswith("ampgan: error: tracking store http://h:5000: line 0: ")
    path = Path(line.rsplit("[cut; the whole message is in ", 1)[1].rstrip("]"))
    assert path.parent == outputs / "errors" and path.suffix == ".log"
    assert str(err) in path.read_text()  # the whole text, its line breaks kept


def test_a_cut_error_logs_the_traceback_of_its_cause(outputs):
    try:
        try:
            raise RuntimeError("deep inside MindSpore " + "z" * 500)
        except RuntimeError as inner:
            raise AmpganError("the first training step failed (" + "x " * 300 + ")") from inner
    except AmpganError as err:
        line = error_line(err)
    text = Path(line.rsplit(" is in ", 1)[1].rstrip("]")).read_text()
    assert len(line) <= MAX_ERROR_LINE and "Traceback" in text and "z" * 500 in text


def test_a_line_within_the_bound_writes_no_log(outputs):
    message = "m" * 40 + " " + "a b " * 90  # 15 + 401 characters = 416: the bound, exactly
    message = message[: MAX_ERROR_LINE - len("ampgan: error: ")]
    assert error_line(message) == "ampgan: error: " + message
    assert not (outputs / "errors").exists()
    assert "[cut; the whole message is in " in error_line(message + "!")
    assert len(list((outputs / "errors").iterdir())) == 1


def test_a_long_word_cut_short_is_logged_whole(outputs):
    line = error_line(f"scaler={'q' * 5000}: no such option")
    assert "(5008 characters) no such option [cut; the whole message is in " in line and len(line) <= MAX_ERROR_LINE
    assert "q" * 5000 in Path(line.rsplit(" is in ", 1)[1].rstrip("]")).read_text()


def test_an_outputs_folder_that_takes_no_file_still_gives_one_short_line(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("AMPGAN_OUTPUTS", str(blocked / "outputs"))  # under a file: no folder can be made
    import tempfile

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(blocked / "tmp"))
    line = error_line("y " * 1000)
    assert len(line) <= MAX_ERROR_LINE and line.endswith(" [cut]"), line


def test_mindspores_compile_cache_is_refused_before_anything_runs(outputs, monkeypatch):
    """MindSpore 2.10's compile cache makes warm CPU runs compute NaN (ampgan.config.preflight.check_environment)."""
    from ampgan.config.preflight import check_environment

    with pytest.raises(AmpganError, match="compile cache"):
        check_environment({"MS_COMPILER_CACHE_ENABLE": "1"})
    check_environment({"MS_COMPILER_CACHE_ENABLE": "0"})
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "1")
    proc = run_cli("trainer.max_steps=2", outputs=outputs)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "compile cache" in proc.stderr
    assert not (outputs / "mlflow.db").exists()
