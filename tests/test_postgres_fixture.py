import sqlalchemy as sa


def test_postgres_is_real(pg_url):
    engine = sa.create_engine(pg_url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("show server_version").scalar().startswith("15")
    engine.dispose()
