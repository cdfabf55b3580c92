"""Bytes per GPU-hour row of candidate usage-ledger layouts on PostgreSQL (issue 40).

Generates GPUS x HOURS ledger rows with names of a real fleet's length (36-character UUIDs,
EC2 node names, deployment pod names), then builds each layout from them and prints one JSON
line per layout: the table's heap and its total (indexes included) per row. The layouts are
the ledger as it is (strings in every row, the primary key over them and the uuid index) and
compact ones (small integer keys into dictionary tables of placements and pods, with one
index or another); the dictionaries' own bytes are printed once (they shrink per row as
hours accrue). --pg auto starts a throwaway PostgreSQL 15 as the tests do.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

SRC = """
SELECT timestamp '2026-11-01' + k * interval '1 hour' AS bucket_start,
  timestamp '2026-11-01' + (k + 1) * interval '1 hour' AS bucket_end,
  'prod-us-east-1-gpu-' || (i / 400) AS cluster,
  'ip-10-0-' || (i / 8 / 250) || '-' || (i / 8 %% 250) || '.ec2.internal' AS node,
  'GPU-' || substr(md5(i::text), 1, 8) || '-' || substr(md5(i::text), 9, 4) || '-' ||
    substr(md5(i::text), 13, 4) || '-' || substr(md5(i::text), 17, 4) || '-' ||
    substr(md5(i::text), 21, 12) AS uuid, '' AS slice,
  CASE WHEN i %% 2 = 0 THEN 'team-ml-research-' || (i %% 20) ELSE '' END AS namespace,
  CASE WHEN i %% 2 = 0 THEN 'train-llama-70b-' || substr(md5((i/4)::text), 1, 9) || '-x2k4p'
       ELSE '' END AS pod,
  'nvidia' AS vendor, 'NVIDIA H100 80GB HBM3' AS model, 1.0::float8 AS gpu_share,
  1.0::float8 AS gpu_hours, (i %% 97)::float8 + 0.25 AS u, (i %% 89)::float8 AS mu,
  40000.0 + i AS mem, 41000.0 + i AS mmem, 300.0 + (i %% 50) AS pw, 300.0 + (i %% 50) AS en,
  1.0::float8 AS cov
FROM generate_series(0, {hours} - 1) k CROSS JOIN generate_series(0, {gpus} - 1) i"""

JOINS = (" JOIN places p USING (cluster, node, uuid, slice)"
         " JOIN pods d USING (namespace, pod)")
LAYOUTS = {
 "current (strings, PK + uuid index)": """
CREATE TABLE t (bucket_start timestamp, cluster varchar(253), node varchar(253),
 uuid varchar(128), slice varchar(64), namespace varchar(253), pod varchar(253),
 bucket_end timestamp NOT NULL, vendor varchar(16), model varchar(128), gpu_share float8,
 gpu_hours float8, avg_utilisation_pct float8, max_utilisation_pct float8,
 avg_memory_used_mib float8, max_memory_used_mib float8, avg_power_w float8, energy_wh float8,
 coverage float8, avg_sm_active_pct float8, avg_tensor_active_pct float8,
 avg_dram_active_pct float8, allocation_basis varchar(16),
 PRIMARY KEY (bucket_start, cluster, node, uuid, slice, namespace, pod));
CREATE INDEX ON t (uuid, bucket_start);
INSERT INTO t SELECT bucket_start, cluster, node, uuid, slice, namespace, pod, bucket_end,
 vendor, model, gpu_share, gpu_hours, u, mu, mem, mmem, pw, en, cov, NULL, NULL, NULL,
 'interval' FROM src""",
 "keys, float8, bucket_end kept, PK (bucket_start, place, pod)": """
CREATE TABLE t (bucket_start timestamp, place int4, pod int4, bucket_end timestamp,
 gpu_share float8, gpu_hours float8, u float8, mu float8, mem float8, mmem float8, pw float8,
 en float8, cov float8, sm float8, tc float8, dr float8, basis int2,
 PRIMARY KEY (bucket_start, place, pod));
INSERT INTO t SELECT s.bucket_start, p.id, d.id, s.bucket_end, gpu_share, gpu_hours, u, mu,
 mem, mmem, pw, en, cov, NULL, NULL, NULL, 0 FROM src s""" + JOINS,
 "keys, float8, no bucket_end, PK (bucket_start, place, pod)": """
CREATE TABLE t (bucket_start timestamp, place int4, pod int4,
 gpu_share float8, gpu_hours float8, u float8, mu float8, mem float8, mmem float8, pw float8,
 en float8, cov float8, sm float8, tc float8, dr float8, basis int2,
 PRIMARY KEY (bucket_start, place, pod));
INSERT INTO t SELECT s.bucket_start, p.id, d.id, gpu_share, gpu_hours, u, mu,
 mem, mmem, pw, en, cov, NULL, NULL, NULL, 0 FROM src s""" + JOINS,
 "keys, float4 secondary, no bucket_end, PK (place, pod, bucket_start)": """
CREATE TABLE t (bucket_start timestamp, place int4, pod int4,
 gpu_hours float8, u float8, en float8, sm float8, gpu_share float4, mu float4, mem float4,
 mmem float4, pw float4, cov float4, tc float4, dr float4, basis int2,
 PRIMARY KEY (place, pod, bucket_start));
INSERT INTO t SELECT s.bucket_start, p.id, d.id, gpu_hours, u, en, NULL, gpu_share, mu,
 mem, mmem, pw, cov, NULL, NULL, 0 FROM src s""" + JOINS,
 "keys, float8, no bucket_end, BRIN(bucket_start) + btree(place, bucket_start)": """
CREATE TABLE t (bucket_start timestamp, place int4, pod int4,
 gpu_share float8, gpu_hours float8, u float8, mu float8, mem float8, mmem float8, pw float8,
 en float8, cov float8, sm float8, tc float8, dr float8, basis int2);
CREATE INDEX ON t USING brin (bucket_start);
CREATE INDEX ON t (place, bucket_start);
INSERT INTO t SELECT s.bucket_start, p.id, d.id, gpu_share, gpu_hours, u, mu,
 mem, mmem, pw, en, cov, NULL, NULL, NULL, 0 FROM src s""" + JOINS,
 "keys, float8, no bucket_end, BRIN(bucket_start) only": """
CREATE TABLE t (bucket_start timestamp, place int4, pod int4,
 gpu_share float8, gpu_hours float8, u float8, mu float8, mem float8, mmem float8, pw float8,
 en float8, cov float8, sm float8, tc float8, dr float8, basis int2);
CREATE INDEX ON t USING brin (bucket_start);
INSERT INTO t SELECT s.bucket_start, p.id, d.id, gpu_share, gpu_hours, u, mu,
 mem, mmem, pw, en, cov, NULL, NULL, NULL, 0 FROM src s""" + JOINS,
    "keys, float4 secondary, no bucket_end, BRIN(bucket_start) only": """
CREATE TABLE t (bucket_start timestamp, place int4, pod int4,
 gpu_hours float8, u float8, en float8, sm float8, gpu_share float4, mu float4, mem float4,
 mmem float4, pw float4, cov float4, tc float4, dr float4, basis int2);
CREATE INDEX ON t USING brin (bucket_start);
INSERT INTO t SELECT s.bucket_start, p.id, d.id, gpu_hours, u, en, NULL, gpu_share, mu,
 mem, mmem, pw, cov, NULL, NULL, 0 FROM src s""" + JOINS,
}


def measure(url: str, gpus: int, hours: int) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE src AS " + SRC.format(gpus=gpus, hours=hours))
        conn.exec_driver_sql(
            "CREATE TABLE places AS SELECT row_number() OVER ()::int4 AS id, cluster, node, "
            "uuid, slice, vendor, model FROM (SELECT DISTINCT cluster, node, uuid, slice, "
            "vendor, model FROM src) x")
        conn.exec_driver_sql(
            "CREATE TABLE pods AS SELECT row_number() OVER ()::int4 AS id, namespace, pod "
            "FROM (SELECT DISTINCT namespace, pod FROM src) x")
        rows = conn.exec_driver_sql("SELECT count(*) FROM src").scalar() or 1
        dictionaries = conn.exec_driver_sql(
            "SELECT pg_total_relation_size('places') + pg_total_relation_size('pods')").scalar()
    print(json.dumps({"rows": rows, "hours": hours,
                      "dictionary_bytes_per_row": round(dictionaries / rows, 1)}), flush=True)
    for name, ddl in LAYOUTS.items():
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS t")
            for stmt in ddl.split(";"):
                conn.exec_driver_sql(stmt)
        with engine.connect() as conn:
            heap = conn.exec_driver_sql("SELECT pg_relation_size('t')").scalar()
            total = conn.exec_driver_sql("SELECT pg_total_relation_size('t')").scalar()
        print(json.dumps({"layout": name, "heap_bytes_per_row": round(heap / rows, 1),
                          "total_bytes_per_row": round(total / rows, 1)}), flush=True)
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2000)
    parser.add_argument("--hours", type=int, default=48)
    parser.add_argument("--pg", default="auto", help="a PostgreSQL server URL (without a "
                        "database; one is created), or 'auto': a throwaway PostgreSQL 15")
    args = parser.parse_args()
    from tests.support.pg import create_database, throwaway_server

    if args.pg == "auto":
        with throwaway_server() as server:
            measure(create_database(server, prefix="layouts_"), args.gpus, args.hours)
    else:
        measure(create_database(args.pg, prefix="layouts_"), args.gpus, args.hours)


if __name__ == "__main__":
    main()
