"""`make spark` / `make flink`: Beam's Spark and Flink job servers and the engines' own distributions, fetched once
by artifact coordinates into a cache outside the repository; nothing is downloaded at run time.

    python -m pipeline.ops.engines.fetch spark flink

Per engine, in `<cache>/<engine>-<version>-beam-<runner version>-<pins digest>/`:
  lib/                      the Beam runner and its Maven dependencies (`mvn dependency:copy-dependencies`)
  dist/                     the engine from PyPI (`pip install --no-deps --target`): pyspark (Spark's jars, bin/) or
                            apache-flink-libraries (Flink's lib/, flink-dist); never installed into the project venv
  beam-<engine>-job-server.jar   a launcher: its manifest names the main class, the Java 17 `Add-Opens` the engine
                            needs and every jar above as `Class-Path`, so `java -jar` (and Beam's
                            `--spark_job_server_jar` / `--flink_job_server_jar`) runs the job server as a shaded jar would
  .complete                 the pins it was built from; written last (the directory is built under a temporary name
                            and renamed), so a half-fetched cache is never used.
The coordinates are in pyproject.toml's [tool.pileprep.engines] (why those versions: the comment there).
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass
from typing import Optional

REPO = pathlib.Path(__file__).resolve().parents[3]
ENGINES = ("spark", "flink")
MAIN_CLASS = {"spark": "org.apache.beam.runners.spark.SparkJobServerDriver",
              "flink": "org.apache.beam.runners.flink.FlinkJobServerDriver"}
# What Spark's launcher adds on Java 17 (spark-class's JavaModuleOptions, Spark 3.5) and Flink's env.java.opts.all
# default: the job server runs the engine's driver/client in its own JVM.
ADD_OPENS = ("java.base/java.lang", "java.base/java.lang.invoke", "java.base/java.lang.reflect", "java.base/java.io",
             "java.base/java.net", "java.base/java.nio", "java.base/java.util", "java.base/java.util.concurrent",
             "java.base/java.util.concurrent.atomic", "java.base/sun.nio.ch", "java.base/sun.nio.cs",
             "java.base/sun.security.action", "java.base/sun.util.calendar", "java.base/java.text",
             "java.base/java.time", "java.base/jdk.internal.misc", "java.base/sun.util.calendar")
JVM_OPENS = ["-XX:+IgnoreUnrecognizedVMOptions", *[f"--add-opens={m}=ALL-UNNAMED" for m in dict.fromkeys(ADD_OPENS)]]


class EngineSetupError(Exception):
    """A missing prerequisite or engine, said in one line that names the make target."""


@dataclass(frozen=True)
class EnginePins:
    engine: str
    runner: str          # group:artifact:version of the Beam runner
    job_service: str
    extras: tuple[str, ...]
    dist_package: str    # the PyPI distribution holding the engine's jars
    dist_version: str

    @property
    def runner_version(self) -> str:
        return self.runner.rsplit(":", 1)[1]

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.__dict__, sort_keys=True, default=list).encode()).hexdigest()[:12]


def load_pins(engine: str, pyproject: Optional[pathlib.Path] = None) -> EnginePins:
    if engine not in ENGINES:
        raise EngineSetupError(f"unknown engine {engine!r}: expected one of {', '.join(ENGINES)}")
    path = pyproject or REPO / "pyproject.toml"
    try:
        table = tomllib.loads(path.read_text())["tool"]["pileprep"]["engines"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
        raise EngineSetupError(f"{path}: no [tool.pileprep.engines] table ({e}); run from a pileprep checkout") from None
    if engine == "spark":
        return EnginePins("spark", table["spark_runner"], table["job_service"], tuple(table["runner_extras"]),
                          "pyspark", table["pyspark"])
    return EnginePins("flink", table["flink_runner"], table["job_service"], tuple(table["runner_extras"]),
                      "apache-flink-libraries", table["apache_flink_libraries"])


def cache_root() -> pathlib.Path:
    explicit = os.environ.get("PILEPREP_ENGINES_CACHE")
    if explicit:
        return pathlib.Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(pathlib.Path.home() / ".cache")
    return pathlib.Path(base) / "pileprep" / "engines"


def engine_dir(pins: EnginePins) -> pathlib.Path:
    return cache_root() / f"{pins.engine}-{pins.dist_version}-beam-{pins.runner_version}-{pins.digest()}"


def launcher_jar(pins: EnginePins) -> pathlib.Path:
    return engine_dir(pins) / f"beam-{pins.engine}-job-server.jar"


def engine_home(pins: EnginePins) -> pathlib.Path:
    """SPARK_HOME (pyspark's package directory: jars/, bin/) or Flink's (pyflink: lib/, bin/)."""
    return engine_dir(pins) / "dist" / ("pyspark" if pins.engine == "spark" else "pyflink")


def is_complete(pins: EnginePins) -> bool:
    marker = engine_dir(pins) / ".complete"
    try:
        return json.loads(marker.read_text()).get("digest") == pins.digest()
    except (OSError, ValueError, AttributeError):
        return False


def require(engine: str) -> EnginePins:
    """The engine's pins when Java and the fetched engine are there; else EngineSetupError naming `make ENGINE`."""
    pins = load_pins(engine)
    if shutil.which("java") is None:
        raise EngineSetupError(f"{engine}: no `java` on PATH; install OpenJDK 17, then run `make {engine}`")
    if not is_complete(pins):
        raise EngineSetupError(f"{engine}: the job server and {pins.dist_package} {pins.dist_version} are not in "
                               f"{engine_dir(pins)}; run `make {engine}` once (it fetches them with mvn and pip)")
    return pins


def pom_xml(pins: EnginePins) -> str:
    """A throwaway pom whose runtime dependencies are the job server's classpath (the runner's own job-service
    dependency swapped for the served one, without its transitive Beam modules: the runner's are used)."""
    def dep(coord: str, exclusions: str = "") -> str:
        g, a, v = coord.split(":")
        return (f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>"
                f"{exclusions}</dependency>")

    js_g, js_a, _ = pins.job_service.split(":")
    deps = [dep(pins.runner, f"<exclusions><exclusion><groupId>{js_g}</groupId><artifactId>{js_a}</artifactId>"
                             "</exclusion></exclusions>"),
            dep(pins.job_service, "<exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId>"
                                  "</exclusion></exclusions>"),
            *[dep(c) for c in pins.extras]]
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
            f"<groupId>pileprep.engines</groupId><artifactId>{pins.engine}-job-server</artifactId><version>1"
            f"</version><dependencies>{''.join(deps)}</dependencies></project>\n")


def manifest_text(main_class: str, class_path: list) -> str:
    """A jar manifest: main class, Add-Opens, Class-Path (relative to the launcher jar), 72-byte lines."""
    def wrap(line: str) -> list:
        data, out = line.encode(), []
        while len(data) > 72:
            cut = 72 if not out else 71
            while (data[cut] & 0xC0) == 0x80:  # never split a UTF-8 sequence
                cut -= 1
            out.append(data[:cut])
            data = data[cut:]
        out.append(data)
        return [(b" " if i else b"") + part for i, part in enumerate(out)]

    lines = ["Manifest-Version: 1.0", f"Main-Class: {main_class}",
             "Add-Opens: " + " ".join(dict.fromkeys(ADD_OPENS)), "Class-Path: " + " ".join(class_path)]
    return b"\r\n".join(part for line in lines for part in wrap(line)).decode() + "\r\n\r\n"


def write_launcher(jar: pathlib.Path, main_class: str, class_path: list) -> None:
    with zipfile.ZipFile(jar, "w", zipfile.ZIP_DEFLATED) as z:
        info = zipfile.ZipInfo("META-INF/MANIFEST.MF", date_time=(1980, 1, 1, 0, 0, 0))
        z.writestr(info, manifest_text(main_class, class_path))


def _run(argv: list, what: str, log: pathlib.Path) -> None:
    with open(log, "ab") as f:
        res = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, check=False)
    if res.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise EngineSetupError(f"{what} failed (exit {res.returncode}; log {log}): " + " | ".join(tail)[-400:])


def fetch(engine: str) -> pathlib.Path:
    """Fetch one engine into the cache (idempotent: a complete cache is kept as it is). Returns its directory."""
    pins = load_pins(engine)
    final = engine_dir(pins)
    if is_complete(pins):
        return final
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            raise EngineSetupError(f"make {engine}: no `{tool}` on PATH; install OpenJDK 17 and Maven "
                                   "(Debian: apt-get install openjdk-17-jdk-headless maven)")
    if final.exists():
        raise EngineSetupError(f"make {engine}: {final} exists but is incomplete (no matching .complete); remove it "
                               "and run the target again")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
    try:
        log = tmp / "fetch.log"
        (tmp / "pom.xml").write_text(pom_xml(pins))
        _run(["mvn", "-B", "-q", "-f", str(tmp / "pom.xml"), "dependency:copy-dependencies",
              "-DincludeScope=runtime", f"-DoutputDirectory={tmp / 'lib'}"], f"make {engine}: mvn (Beam's runner)", log)
        _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(tmp / "dist"),
              f"{pins.dist_package}=={pins.dist_version}"], f"make {engine}: pip ({pins.dist_package})", log)
        home = tmp / "dist" / ("pyspark" if engine == "spark" else "pyflink")
        for script in (home / "bin").glob("*"):  # pip drops the exec bits of package data
            script.chmod(script.stat().st_mode | 0o111)
        jars = sorted(p.relative_to(tmp).as_posix() for p in (tmp / "lib").glob("*.jar"))
        if engine == "spark":  # Spark's jars (the runner's pom has them `provided`) from the same distribution
            jars += sorted(p.relative_to(tmp).as_posix() for p in (home / "jars").glob("*.jar"))
        if not jars or not any(pins.runner.split(":")[1] in j for j in jars):
            raise EngineSetupError(f"make {engine}: mvn left no {pins.runner} in {tmp / 'lib'}")
        write_launcher(tmp / launcher_jar(pins).name, MAIN_CLASS[engine], jars)
        (tmp / ".complete").write_text(json.dumps({"digest": pins.digest(), "pins": pins.__dict__}, default=list))
        try:
            os.rename(tmp, final)
        except OSError:  # a concurrent fetch finished first: its complete copy stays
            if not is_complete(pins):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def say(line: str, error: bool = False) -> None:
    """The make targets' output (these modules are `python -m` entry points of the Makefile, not the service's
    library: like pipeline/options.py's __main__ they write to the terminal; an error is the CLI's one line)."""
    if error:
        sys.stderr.write(f"pileprep: error: {line}\n")
    else:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main(argv: Optional[list] = None) -> int:
    engines = list(sys.argv[1:] if argv is None else argv) or list(ENGINES)
    try:
        for engine in engines:
            where = fetch(engine)
            say(f"{engine}: {where}")
    except EngineSetupError as e:
        say(str(e), error=True)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
