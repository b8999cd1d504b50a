from ckptlab.settings import Settings


def test_empty_api_token_means_no_token(monkeypatch):
    monkeypatch.setenv("CKPTLAB_API_TOKEN", "")
    assert Settings().api_token is None
    monkeypatch.setenv("CKPTLAB_API_TOKEN", "s3cret")
    assert Settings().api_token.get_secret_value() == "s3cret"


def test_default_database_is_sqlite_under_data_dir(tmp_path):
    s = Settings(data_dir=tmp_path, database_url=None)
    assert s.resolved_database_url == f"sqlite:///{(tmp_path / 'ckptlab.db').resolve()}"
