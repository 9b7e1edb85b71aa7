"""The study's Optuna side: Optuna imported (or one line saying how to install it), the storage reached before
anything is written to it, the study created or loaded (one made for another search refused), its sampler and
pruner."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tpuplex.commands.tune.search import Search
from tpuplex.commands.tune.summary import left_out
from tpuplex.config import Config
from tpuplex.errors import TpuplexError

SPEC_ATTR = "tpuplex.search"
"""The study's user attribute holding what it is for (`Search.fingerprint`)."""
CONFIG_ATTR = "tpuplex.config"
"""The study's user attribute holding the config its trials' values are laid over (`Config.to_dict`)."""
INSTALL = "pip install 'tpuplex-core[tune]'"


def import_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise TpuplexError(f"tpuplex tune needs Optuna: {INSTALL}") from None
    return optuna


POSTGRES_DRIVERS = (("psycopg", "postgresql+psycopg"), ("psycopg2", "postgresql+psycopg2"))
"""The driver a bare postgresql:// URL is read with: the first of these installed (SQLAlchemy's own choice for a
bare URL is one driver, psycopg 3 from 2.1 on, whether or not it is installed)."""
DRIVER_INSTALL = {"psycopg": "pip install 'psycopg[binary]'", "psycopg2": "pip install psycopg2-binary"}


def reach(url: str) -> tuple[Any, dict[str, Any], str]:
    """The storage URL parsed (a bare postgresql:// given the driver installed, `POSTGRES_DRIVERS`), the engine's
    arguments and the URL as shown (no password), once a connection to it is made: nothing is written to it."""
    import sqlalchemy
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except sqlalchemy.exc.ArgumentError:
        raise TpuplexError(f"--storage {url!r} is not a database URL: use e.g. postgresql://user@host/db or "
                           "sqlite:///path/study.db") from None
    shown = parsed.render_as_string(hide_password=True)
    if parsed.drivername in ("postgresql", "postgres"):
        driver = next((driver for module, driver in POSTGRES_DRIVERS if _importable(module)), None)
        if driver is None:
            raise TpuplexError(f"--storage {shown} needs a PostgreSQL driver, and none is installed: "
                               f"{DRIVER_INSTALL['psycopg']} (or {INSTALL})")
        parsed = parsed.set(drivername=driver)
        shown = parsed.render_as_string(hide_password=True)
    arguments = ({"connect_args": {"timeout": 60}} if parsed.get_backend_name() == "sqlite"
                 else {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}
                 if parsed.get_backend_name() == "postgresql" else {})
    try:
        engine = sqlalchemy.create_engine(parsed, **arguments)
        with engine.connect():
            pass
        engine.dispose()
    except ImportError as error:  # the driver the URL names is not installed
        install = DRIVER_INSTALL.get(error.name or "", "install it")
        raise TpuplexError(f"--storage {shown} is read with the Python module {error.name}, which is not installed: "
                           f"{install}, or name an installed driver in the URL") from None
    except (sqlalchemy.exc.SQLAlchemyError, OSError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise TpuplexError(f"--storage {shown} cannot be reached ({first}): start the database or fix the URL "
                           "(nothing was written to it)") from None
    return parsed, arguments, shown


def open_storage(optuna: Any, url: str, plan: Search, retry: Any) -> tuple[Any, str]:
    """The RDB storage with heartbeats, reached before anything is written to it (`reach`), and its URL as shown
    to the user (no password)."""
    import sqlalchemy

    parsed, arguments, shown = reach(url)
    for attempt in range(1, 6):
        try:
            return optuna.storages.RDBStorage(
                parsed.render_as_string(hide_password=False), engine_kwargs=arguments,
                heartbeat_interval=plan.heartbeat_interval, grace_period=plan.grace_period,
                heartbeat_stale_trial_callback=retry), shown
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            # Workers that start together on a new database race to create Optuna's tables: the losers find them
            # made on their next try.
            if attempt == 5:
                raise
            time.sleep(0.5 * attempt)
        except sqlalchemy.exc.SQLAlchemyError as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise TpuplexError(f"--storage {shown} cannot hold an Optuna study ({first})") from None
    raise AssertionError("unreachable")


def open_study(optuna: Any, storage: Any, plan: Search, shown_url: str, base: Config, backend: str) -> Any:
    """The study, created by the first worker, loaded by the others; one made for another search
    (`Search.fingerprint` of `base` on `backend`) is refused, naming what differs (a config's fields)."""
    study = optuna.create_study(storage=storage, study_name=plan.study, direction=plan.direction,
                                sampler=_sampler(optuna, plan), pruner=_pruner(optuna, plan), load_if_exists=True)
    wanted = json.loads(json.dumps(plan.fingerprint(base.hash_with_length(), backend)))
    recorded = study.user_attrs.get(SPEC_ATTR)
    counted = [t for t in study.get_trials(deepcopy=False) if not left_out(t)]
    if recorded is not None and recorded != wanted and counted:
        differs = [key for key in wanted if recorded.get(key) != wanted[key]]
        what = {"space": "another space", "metric": "another metric", "direction": "another direction",
                "config_hash": f"another config ({_config_changes(study, recorded, base)})",
                "backend": f"another backend ({recorded.get('backend')})"}[differs[0]]
        raise TpuplexError(f"study {plan.study!r} in {shown_url} was created with {what}: give this search "
                           "another tune.study or --output, or restore the one it was made with")
    if recorded != wanted:
        study.set_user_attr(SPEC_ATTR, wanted)
        study.set_user_attr(CONFIG_ATTR, base.to_dict())
    if study.direction.name.lower() != plan.direction:
        raise TpuplexError(f"study {plan.study!r} in {shown_url} was created to {study.direction.name.lower()}: "
                           "give this search another tune.study or --output")
    return study


def _config_changes(study: Any, recorded: dict[str, Any], base: Config) -> str:
    """The fields of `base` that differ from the config the study was made with, or, for a study that did not
    record its config, the two hashes."""
    made_with = study.user_attrs.get(CONFIG_ATTR)
    changes = base.changes_from(made_with, with_length=True) if isinstance(made_with, dict) else []
    return "; ".join(changes) or f"hash {recorded.get('config_hash')}, now {base.hash_with_length()}"


def _sampler(optuna: Any, plan: Search) -> Any:
    def make(seed: int) -> Any:
        if plan.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if plan.sampler == "grid":
            return optuna.samplers.GridSampler({dim.field: dim.grid() for dim in plan.space}, seed=seed)
        return optuna.samplers.TPESampler(seed=seed)

    return _trial_seeded(optuna, make, plan.seed)


def _pruner(optuna: Any, plan: Search) -> Any:
    pruners = optuna.pruners
    if plan.pruner == "median":
        return pruners.MedianPruner(n_startup_trials=plan.pruner_startup_trials,
                                    n_warmup_steps=plan.pruner_warmup_steps)
    if plan.pruner == "hyperband":
        return pruners.HyperbandPruner()
    if plan.pruner == "successive_halving":
        return pruners.SuccessiveHalvingPruner()
    return pruners.NopPruner()


def _trial_seeded(optuna: Any, make: Callable[[int], Any], seed: int) -> Any:
    """A sampler that is `make(seed')` anew for each trial, seed' drawn from `seed` and the trial's number: one
    worker's search is repeated exactly, and workers that start together draw different values."""

    class TrialSeeded(optuna.samplers.BaseSampler):
        def __init__(self) -> None:
            self._inner = make(seed)

        def before_trial(self, study: Any, trial: Any) -> None:
            # Hashed (numpy's SeedSequence): Mersenne Twisters seeded with nearby integers draw alike at first.
            self._inner = make(int(np.random.SeedSequence([seed, trial.number]).generate_state(1)[0]))
            self._inner.before_trial(study, trial)

        def infer_relative_search_space(self, study: Any, trial: Any) -> Any:
            return self._inner.infer_relative_search_space(study, trial)

        def sample_relative(self, study: Any, trial: Any, search_space: Any) -> Any:
            return self._inner.sample_relative(study, trial, search_space)

        def sample_independent(self, study: Any, trial: Any, name: str, distribution: Any) -> Any:
            return self._inner.sample_independent(study, trial, name, distribution)

        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            self._inner.after_trial(study, trial, state, values)

    return TrialSeeded()


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
