"""Offline checks of the Android demo, for machines without the Android SDK.

What can be proven without Gradle, Maven or android.jar:

1. resources: ``aapt2 compile`` + ``aapt2 link`` of res/ and the manifest
   against the platform's framework-res.apk (Debian ``android-framework-res``,
   API 29), which also generates the app's ``R`` class;
2. app: every Kotlin source of the app compiled by kotlinc against small
   stubs of the Android, CameraX, androidx.activity and LiteRT classes it
   uses (``stubs/``, limited to the signatures the app calls) and that ``R``;
3. core + tests: the pure-Kotlin classes (``org.edgevit.demo.core``)
   compiled with their JUnit tests *without* any stub on the class path
   (proving they need no Android), then run with JUnit 4 on the JVM.

Usage: ``python android_demo/offline-check/offline_check.py [--golden DIR] [--out DIR]``
(``check.sh`` does the same). Each step reports the tool it lacks instead of
failing when a tool is missing; the pytest suite turns that into a skip.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1]
APP = DEMO / "app"
MAIN_SRC = APP / "src" / "main"
KOTLIN_MAIN = MAIN_SRC / "java"
CORE_PACKAGE_DIR = KOTLIN_MAIN / "org" / "edgevit" / "demo" / "core"
TEST_SRC = APP / "src" / "test" / "java"
TEST_RESOURCES = APP / "src" / "test" / "resources"
STUBS = Path(__file__).resolve().parent / "stubs"
NAMESPACE = "org.edgevit.demo"
MIN_SDK, TARGET_SDK = 24, 36
FRAMEWORK_RES = Path("/usr/share/android-framework-res/framework-res.apk")
# Manifest elements newer than the API 29 aapt2/framework-res Debian ships:
# removed from the copy that is linked (they are valid on current SDKs).
NEWER_THAN_API_29 = ("uses-native-library",)
TOOLS_PREFIX = Path(os.environ.get("EDGEVIT_TOOLS_PREFIX", Path.home() / ".cache" / "edgevit-test-tools"))


@dataclass
class Tools:
    kotlinc: str | None = None
    kotlin_lib: Path | None = None
    java: str | None = None
    javac: str | None = None
    aapt2: str | None = None
    framework_res: Path | None = None
    junit: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)

    def lacking(self, *names: str) -> str | None:
        """A sentence naming the missing tools among ``names``, or None."""
        why = [self.missing[n] for n in names if n in self.missing]
        return "; ".join(why) if why else None


def _npm_kotlinc() -> Path | None:
    candidates = [TOOLS_PREFIX / "node_modules" / "kotlin-compiler" / "bin" / "kotlinc"]
    npm = shutil.which("npm")
    if npm:
        try:
            root = subprocess.run([npm, "root", "-g"], capture_output=True, text=True, timeout=30).stdout.strip()
            if root:
                candidates.append(Path(root) / "kotlin-compiler" / "bin" / "kotlinc")
        except (OSError, subprocess.SubprocessError):
            pass
    return next((c for c in candidates if c.is_file()), None)


def find_tools() -> Tools:
    tools = Tools()
    install = "bash scripts/install-test-tools.sh"
    kotlinc = os.environ.get("KOTLINC") or _npm_kotlinc() or shutil.which("kotlinc")
    if kotlinc:
        tools.kotlinc = str(kotlinc)
        lib = Path(os.path.realpath(kotlinc)).parent.parent / "lib"
        tools.kotlin_lib = lib if (lib / "kotlin-stdlib.jar").is_file() else None
        if tools.kotlin_lib is None:
            tools.missing["kotlin-stdlib"] = f"kotlin-stdlib.jar not found next to {kotlinc}"
    else:
        tools.missing["kotlinc"] = f"kotlinc not found (npm package kotlin-compiler; {install})"
    for name in ("java", "javac"):
        path = shutil.which(name)
        if path:
            setattr(tools, name, path)
        else:
            tools.missing[name] = f"{name} not found (a JDK 17+; Debian openjdk-17-jdk-headless)"
    tools.aapt2 = shutil.which("aapt2")
    if not tools.aapt2:
        tools.missing["aapt2"] = f"aapt2 not found (Debian package aapt; {install})"
    if FRAMEWORK_RES.is_file():
        tools.framework_res = FRAMEWORK_RES
    else:
        tools.missing["framework-res"] = f"{FRAMEWORK_RES} not found (Debian package android-framework-res)"
    env_junit = os.environ.get("JUNIT_JARS")
    jars = env_junit.split(os.pathsep) if env_junit else [
        "/usr/share/java/junit4.jar", "/usr/share/java/hamcrest-core.jar"]
    if all(Path(j).is_file() for j in jars):
        tools.junit = jars
    else:
        tools.missing["junit"] = f"JUnit 4 jars not found ({', '.join(jars)}; Debian package junit4)"
    return tools


@dataclass
class StepResult:
    name: str
    ok: bool
    seconds: float
    output: str = ""
    skipped: str | None = None

    def summary(self) -> str:
        if self.skipped:
            return f"SKIP {self.name}: {self.skipped}"
        return f"{'PASS' if self.ok else 'FAIL'} {self.name} ({self.seconds:.1f} s)"


def _run(cmd: list[str], timeout: float = 600, **kwargs) -> tuple[int, str]:
    env = dict(os.environ)
    # kotlinc is a short-lived JVM: the C1 compiler alone roughly halves its run time.
    env.setdefault("JAVA_OPTS", "-Xmx1g -XX:TieredStopAtLevel=1 -XX:+UseParallelGC")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kwargs)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _sources(root: Path, suffix: str) -> list[str]:
    return sorted(str(p) for p in root.rglob(f"*{suffix}"))


def linkable_manifest(text: str) -> tuple[str, list[str]]:
    """The manifest as AGP hands it to aapt2: ``package`` from the Gradle
    namespace; minus elements the API 29 aapt2 does not know."""
    removed = []
    for element in NEWER_THAN_API_29:
        pattern = re.compile(rf"\s*<{element}\b[^>]*/>", re.S)
        removed += [element] * len(pattern.findall(text))
        text = pattern.sub("", text)
    text, n = re.subn(r"<manifest\b", f'<manifest package="{NAMESPACE}"', text, count=1)
    if n != 1:
        raise ValueError("no <manifest> element")
    return text, removed


def link_resources(tools: Tools, out: Path) -> StepResult:
    """aapt2 compile + link; writes ``out/gen/.../R.java`` and ``out/resources.apk``."""
    start = time.perf_counter()
    why = tools.lacking("aapt2", "framework-res")
    if why:
        return StepResult("aapt2 link (resources + manifest)", False, 0.0, skipped=why)
    out.mkdir(parents=True, exist_ok=True)
    compiled = out / "res.zip"
    rc, log = _run([tools.aapt2, "compile", "--dir", str(MAIN_SRC / "res"), "-o", str(compiled)])
    if rc == 0:
        manifest_text, removed = linkable_manifest((MAIN_SRC / "AndroidManifest.xml").read_text())
        manifest = out / "AndroidManifest.xml"
        manifest.write_text(manifest_text)
        gen = out / "gen"
        shutil.rmtree(gen, ignore_errors=True)
        rc, link_log = _run([tools.aapt2, "link", "-o", str(out / "resources.apk"),
                             "-I", str(tools.framework_res), "--manifest", str(manifest),
                             "--java", str(gen), "--min-sdk-version", str(MIN_SDK),
                             "--target-sdk-version", str(TARGET_SDK), str(compiled)])
        log = "\n".join(filter(None, [log, link_log,
                                      f"(not linked, newer than API 29: {', '.join(removed)})" if removed else ""]))
    return StepResult("aapt2 link (resources + manifest)", rc == 0, time.perf_counter() - start, log)


def compile_app(tools: Tools, out: Path) -> StepResult:
    """javac the Java stubs + generated R; kotlinc the Kotlin stubs + every app source."""
    start = time.perf_counter()
    name = "kotlinc app sources against API stubs"
    why = tools.lacking("kotlinc", "kotlin-stdlib", "javac", "aapt2", "framework-res")
    if why:
        return StepResult(name, False, 0.0, skipped=why)
    r_java = _sources(out / "gen", ".java")
    if not r_java:
        return StepResult(name, False, 0.0, "no generated R.java: run link_resources first")
    stub_classes = out / "stub-classes"
    shutil.rmtree(stub_classes, ignore_errors=True)
    rc, log = _run([tools.javac, "-nowarn", "--release", "17", "-d", str(stub_classes),
                    *_sources(STUBS / "java", ".java"), *r_java])
    if rc != 0:
        return StepResult(name, False, time.perf_counter() - start, "javac stubs failed:\n" + log)
    app_classes = out / "app-classes"
    shutil.rmtree(app_classes, ignore_errors=True)
    rc, log = _run([tools.kotlinc, "-Werror", "-jvm-target", "17", "-no-reflect",
                    "-cp", str(stub_classes), "-d", str(app_classes),
                    *_sources(STUBS / "kotlin", ".kt"), *_sources(KOTLIN_MAIN, ".kt")])
    return StepResult(name, rc == 0, time.perf_counter() - start, log)


def compile_tests(tools: Tools, out: Path) -> StepResult:
    """kotlinc the pure core classes with their tests, with no stub on the class path."""
    start = time.perf_counter()
    name = "kotlinc core classes + JUnit tests (no Android on the class path)"
    why = tools.lacking("kotlinc", "kotlin-stdlib", "junit")
    if why:
        return StepResult(name, False, 0.0, skipped=why)
    classes = out / "test-classes"
    shutil.rmtree(classes, ignore_errors=True)
    rc, log = _run([tools.kotlinc, "-Werror", "-jvm-target", "17", "-no-reflect",
                    "-cp", os.pathsep.join(tools.junit), "-d", str(classes),
                    *_sources(CORE_PACKAGE_DIR, ".kt"), *_sources(TEST_SRC, ".kt")])
    return StepResult(name, rc == 0, time.perf_counter() - start, log)


def test_class_names() -> list[str]:
    names = []
    for path in sorted(TEST_SRC.rglob("*Test.kt")):
        package = re.search(r"^package\s+([\w.]+)", path.read_text(), re.M)
        names.append(f"{package.group(1)}.{path.stem}" if package else path.stem)
    return names


def run_tests(tools: Tools, out: Path, golden_dir: Path | None = None, assets_dir: Path | None = None) -> StepResult:
    """Run the compiled JUnit tests on the JVM (JUnitCore). ``golden_dir``: the
    golden cases to use; ``assets_dir``: bundled assets for BundledAssetsTest
    (default: the app's own src/main/assets)."""
    start = time.perf_counter()
    name = "JUnit tests on the JVM"
    why = tools.lacking("java", "kotlin-stdlib", "junit")
    if why:
        return StepResult(name, False, 0.0, skipped=why)
    classpath = os.pathsep.join([str(out / "test-classes"), str(tools.kotlin_lib / "kotlin-stdlib.jar"),
                                 str(TEST_RESOURCES), *tools.junit])
    props = [f"-Dedgevit.golden.dir={golden_dir}"] if golden_dir else []
    props.append(f"-Dedgevit.assets.dir={assets_dir or MAIN_SRC / 'assets'}")
    rc, log = _run([tools.java, "-Xmx512m", *props, "-cp", classpath, "org.junit.runner.JUnitCore",
                    *test_class_names()])
    return StepResult(name, rc == 0, time.perf_counter() - start, log)


def junit_counts(output: str) -> tuple[int, int]:
    """(run, failed) from JUnitCore's closing lines."""
    ok = re.search(r"^OK \((\d+) tests?\)", output, re.M)
    if ok:
        return int(ok.group(1)), 0
    bad = re.search(r"^Tests run: (\d+),\s+Failures: (\d+)", output, re.M)
    return (int(bad.group(1)), int(bad.group(2))) if bad else (0, 0)


def build(tools: Tools, out: Path) -> tuple[StepResult, StepResult, StepResult]:
    """Link resources, then compile the app and the tests side by side (two kotlinc
    processes: each is mostly single-threaded JVM start-up and compilation)."""
    from concurrent.futures import ThreadPoolExecutor

    res = link_resources(tools, out / "res")
    with ThreadPoolExecutor(2) as pool:
        tests = pool.submit(compile_tests, tools, out)
        app = compile_app(tools, out / "res") if res.ok else StepResult(
            "kotlinc app sources against API stubs", False, 0.0, skipped=res.skipped or "resources did not link")
        return res, app, tests.result()


def check_all(out: Path, golden_dir: Path | None = None) -> list[StepResult]:
    tools = find_tools()
    res, app, tests = build(tools, out)
    junit = run_tests(tools, out, golden_dir) if tests.ok else StepResult(
        "JUnit tests on the JVM", False, 0.0, skipped=tests.skipped or "tests did not compile")
    return [res, app, tests, junit]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "build")
    parser.add_argument("--golden", type=Path, default=None,
                        help="Golden preprocessing cases to test against (default: the committed copy)")
    args = parser.parse_args(argv)
    results = check_all(args.out, args.golden)
    failed = 0
    for r in results:
        print(r.summary())
        if not r.ok and not r.skipped and r.output:
            print("  " + r.output.replace("\n", "\n  "))
        failed += not r.ok and not r.skipped
    run, junit_failed = junit_counts(results[-1].output)
    if run:
        print(f"junit: {run - junit_failed} passed, {junit_failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
