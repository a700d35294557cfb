"""load_settings(): defaults < GPUPOOL_CONFIG file < GPUPOOL_* environment < overrides."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpupool.config import Settings, load_settings
from gpupool.errors import ConfigError


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test runs in an empty working directory, so relative paths are predictable."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_config(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "gpupool.toml"
    path.write_text(text)
    return {"GPUPOOL_CONFIG": str(path)}


def config_error(environ: dict[str, str], **overrides: object) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(environ, overrides or None)
    return info.value.message


def test_defaults(in_tmp: Path) -> None:
    settings = load_settings({})
    assert settings.database_url == f"sqlite:///{in_tmp}/var/gpupool.db"
    assert settings.templates_dir == str(in_tmp / "slurm_templates")
    assert settings.job_root == str(in_tmp / "var" / "jobs")
    assert (settings.jwt_algorithm, settings.jwt_audience, settings.jwt_default_ttl_s) == ("HS256", "gpupool", 3600)
    assert (settings.container_runtime, settings.container_allowlist, settings.container_mounts) == ("none", (), ())
    assert (settings.default_cpus, settings.default_mem_gb, settings.slurm_query_timeout_s) == (1, 4, 4.0)
    assert settings.slurm_bin("sbatch") == "/usr/bin/sbatch"


def test_precedence_defaults_file_env_overrides(in_tmp: Path) -> None:
    environ = write_config(
        in_tmp,
        'default_cpus = 2\ndefault_mem_gb = 8\nslurm_partition = "from-file"\nslurm_query_timeout_s = 1.5\n',
    )
    environ["GPUPOOL_DEFAULT_CPUS"] = "3"
    environ["GPUPOOL_DEFAULT_TIME_LIMIT_MIN"] = "90"
    settings = load_settings(environ, {"default_time_limit_min": 15})
    assert settings.default_cpus == 3  # env beats file
    assert settings.default_mem_gb == 8  # file beats default
    assert settings.slurm_partition == "from-file"
    assert settings.slurm_query_timeout_s == 1.5
    assert settings.default_time_limit_min == 15  # overrides beat env
    assert settings.max_time_limit_min == 7 * 24 * 60  # default


def test_environ_none_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPOOL_SLURM_PARTITION", "from-os-environ")
    assert load_settings().slurm_partition == "from-os-environ"


def test_list_from_env_is_comma_separated() -> None:
    settings = load_settings(
        {
            "GPUPOOL_CONTAINER_ALLOWLIST": " nvcr.io#nvidia/pytorch:24.01-py3 ,docker.io/library/ubuntu:24.04,, ",
            "GPUPOOL_CONTAINER_MOUNTS": "/datasets:/datasets:ro",
        }
    )
    assert settings.container_allowlist == ("nvcr.io#nvidia/pytorch:24.01-py3", "docker.io/library/ubuntu:24.04")
    assert settings.container_mounts == ("/datasets:/datasets:ro",)


def test_empty_list_from_env() -> None:
    assert load_settings({"GPUPOOL_CONTAINER_ALLOWLIST": ""}).container_allowlist == ()


def test_list_from_toml_array(in_tmp: Path) -> None:
    environ = write_config(in_tmp, 'container_allowlist = ["a:1", "b:2"]\ncontainer_mounts = ["/datasets:/datasets:ro", "/scratch:/scratch"]\n')
    settings = load_settings(environ)
    assert settings.container_allowlist == ("a:1", "b:2")
    assert settings.container_mounts == ("/datasets:/datasets:ro", "/scratch:/scratch")


def test_env_list_replaces_file_list(in_tmp: Path) -> None:
    environ = write_config(in_tmp, 'container_allowlist = ["a:1", "b:2"]\n')
    environ["GPUPOOL_CONTAINER_ALLOWLIST"] = "c:3"
    assert load_settings(environ).container_allowlist == ("c:3",)


def test_unknown_key_in_file(in_tmp: Path) -> None:
    environ = write_config(in_tmp, 'default_cpus = 2\njwt_secrte = "typo"\n')
    assert config_error(environ) == f"{in_tmp / 'gpupool.toml'}: unknown setting(s) jwt_secrte"


def test_table_in_file_is_unknown(in_tmp: Path) -> None:
    environ = write_config(in_tmp, "[slurm]\npartition = 'gpu'\n")
    assert "unknown setting(s) slurm" in config_error(environ)


def test_missing_config_file(in_tmp: Path) -> None:
    assert "does not exist" in config_error({"GPUPOOL_CONFIG": str(in_tmp / "absent.toml")})


def test_invalid_toml(in_tmp: Path) -> None:
    assert "is not valid TOML" in config_error(write_config(in_tmp, "default_cpus = = 2\n"))


@pytest.mark.parametrize("value", ["four", "", "4.5", "0x10"])
def test_bad_int_from_env(value: str) -> None:
    message = config_error({"GPUPOOL_DEFAULT_CPUS": value})
    assert message.startswith(f"setting default_cpus: cannot read {value!r} as ")


@pytest.mark.parametrize(
    "text",
    ['default_cpus = "four"', "default_cpus = true", "default_cpus = 2.5", "default_cpus = [1]", "default_cpus = {n = 1}"],
)
def test_bad_int_from_file(in_tmp: Path, text: str) -> None:
    assert config_error(write_config(in_tmp, text + "\n")).startswith("setting default_cpus: cannot read ")


@pytest.mark.parametrize(
    "text", ['slurm_query_timeout_s = "soon"', "slurm_query_timeout_s = true", "slurm_query_timeout_s = [1.0]"]
)
def test_bad_float_from_file(in_tmp: Path, text: str) -> None:
    assert config_error(write_config(in_tmp, text + "\n")).startswith("setting slurm_query_timeout_s: cannot read ")


def test_int_and_float_from_file(in_tmp: Path) -> None:
    settings = load_settings(write_config(in_tmp, "default_cpus = 6\nslurm_query_timeout_s = 2\n"))
    assert (settings.default_cpus, settings.slurm_query_timeout_s) == (6, 2.0)


def test_bad_float_from_env() -> None:
    assert config_error({"GPUPOOL_SLURM_QUERY_TIMEOUT_S": "soon"}).startswith("setting slurm_query_timeout_s: cannot read ")


def test_bad_string_from_file(in_tmp: Path) -> None:
    assert config_error(write_config(in_tmp, "slurm_partition = ['a']\n")).startswith("setting slurm_partition: cannot read ")


def test_bad_container_runtime() -> None:
    assert config_error({"GPUPOOL_CONTAINER_RUNTIME": "podman"}) == (
        "container_runtime must be one of none, pyxis, docker, not 'podman'"
    )


@pytest.mark.parametrize("runtime", ["none", "pyxis", "docker"])
def test_good_container_runtime(runtime: str) -> None:
    assert load_settings({"GPUPOOL_CONTAINER_RUNTIME": runtime}).container_runtime == runtime


def test_bad_jwt_algorithm() -> None:
    assert config_error({"GPUPOOL_JWT_ALGORITHM": "none"}) == "jwt_algorithm must be HS256 or RS256, not 'none'"


def test_a_senders_role_needs_the_api_and_billing_roles() -> None:
    assert "need database_api_role and database_billing_role" in config_error({"GPUPOOL_DATABASE_EMAIL_ROLE": "gpupool_email"})
    settings = load_settings({
        "GPUPOOL_DATABASE_API_ROLE": "gpupool_api", "GPUPOOL_DATABASE_BILLING_ROLE": "gpupool_billing",
        "GPUPOOL_DATABASE_WEBHOOKS_ROLE": "gpupool_webhooks",
    })
    assert (settings.database_webhooks_role, settings.database_email_role) == ("gpupool_webhooks", "")


def test_non_positive_refresh_interval() -> None:
    assert config_error({"GPUPOOL_REFRESH_INTERVAL_S": "0"}) == "refresh_interval_s must be positive"


def test_unknown_override() -> None:
    assert config_error({}, no_such_setting=1) == "unknown setting no_such_setting"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///rel/gpupool.db", "sqlite:///{cwd}/rel/gpupool.db"),
        ("sqlite:///gpupool.db", "sqlite:///{cwd}/gpupool.db"),
        ("sqlite:////abs/gpupool.db", "sqlite:////abs/gpupool.db"),
        ("sqlite://", "sqlite://"),
        ("sqlite:///:memory:", "sqlite:///:memory:"),
        ("postgresql+psycopg2://gpupool:pw@db:5432/gpupool", "postgresql+psycopg2://gpupool:pw@db:5432/gpupool"),
    ],
)
def test_sqlite_url_made_absolute(in_tmp: Path, url: str, expected: str) -> None:
    assert load_settings({"GPUPOOL_DATABASE_URL": url}).database_url == expected.format(cwd=in_tmp)


def test_relative_sqlite_url_from_file(in_tmp: Path) -> None:
    environ = write_config(in_tmp, 'database_url = "sqlite:///state/db.sqlite"\n')
    assert load_settings(environ).database_url == f"sqlite:///{in_tmp}/state/db.sqlite"


def test_relative_paths_resolved_at_load(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings({"GPUPOOL_TEMPLATES_DIR": "tpl", "GPUPOOL_JOB_ROOT": "jobs", "GPUPOOL_JWT_PUBLIC_KEY_FILE": "k.pub"})
    monkeypatch.chdir("/")
    assert settings.templates_dir == str(in_tmp / "tpl")
    assert settings.job_root == str(in_tmp / "jobs")
    assert settings.jwt_public_key_file == str(in_tmp / "k.pub")
    assert settings.jwt_private_key_file == ""


def test_settings_are_frozen() -> None:
    settings = load_settings({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.default_cpus = 9  # type: ignore[misc]
    assert settings.replace(default_cpus=9).default_cpus == 9
    assert settings.default_cpus == 1


def test_replace_validates() -> None:
    with pytest.raises(ConfigError):
        Settings(service_user="x").replace(container_runtime="lxc")


def test_systemd_credentials_override_the_environment(tmp_path: Path) -> None:
    # What LoadCredential= gives a unit: one file per secret, named after the setting.
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "database_url").write_text("postgresql://gpupool_api:secret@127.0.0.1/gpupool\n")
    (credentials / "ratelimit_storage_uri").write_text("redis://:pw@127.0.0.1:6379/0")
    settings = load_settings(
        {"CREDENTIALS_DIRECTORY": str(credentials), "GPUPOOL_DATABASE_URL": "sqlite:///x.db", "GPUPOOL_JWT_SECRET": "j" * 32}
    )
    assert settings.database_url == "postgresql://gpupool_api:secret@127.0.0.1/gpupool"
    assert settings.ratelimit_storage_uri == "redis://:pw@127.0.0.1:6379/0"
    # A credential the unit was not given is not there: the environment's value stands.
    assert settings.jwt_secret == "j" * 32
    assert settings.billing_database_url == ""
