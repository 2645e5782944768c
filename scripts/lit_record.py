"""A lit test format that runs only the compiles of each test's RUN lines.

scripts/omp-conformance.sh --record uses it to build LLVM's offload suite for a GPU on a
machine without one: each RUN line is expanded as lit expands it, parsed with lit's own shell
parser, and every command of it that is the recording compiler (scripts/lit-cc --record) or an
LLVM tool (llvm-ar) runs, in order; the programs, FileCheck and everything else do not. A test is PASS when its compiles
ran (a failed compile is recorded too, and replays as that failure), UNSUPPORTED as lit says.
"""

import os
import re
import subprocess

import lit.formats
import lit.ShUtil
import lit.Test
import lit.TestRunner


def _commands(node, out):
    """The commands of a parsed shell line, in order."""
    if isinstance(node, lit.ShUtil.Seq):
        _commands(node.lhs, out)
        _commands(node.rhs, out)
    elif isinstance(node, lit.ShUtil.Pipeline):
        for c in node.commands:
            _commands(c, out)
    elif isinstance(node, lit.ShUtil.Command):
        out.append([str(a) for a in node.args])


class RecordFormat(lit.formats.ShTest):
    def execute(self, test, litConfig):
        if test.config.unsupported:
            return lit.Test.Result(lit.Test.UNSUPPORTED, "Test is unsupported")
        parsed = lit.TestRunner.parseIntegratedTestScript(test, require_script=True)
        if isinstance(parsed, lit.Test.Result):
            return parsed
        tmp_dir, tmp_base = lit.TestRunner.getTempPaths(test)
        subs = lit.TestRunner.getDefaultSubstitutions(test, tmp_dir, tmp_base)
        conditions = {f: True for f in test.config.available_features}
        script = lit.TestRunner.applySubstitutions(
            parsed, subs, conditions, recursion_limit=test.config.recursiveExpansionLimit
        )
        cwd = os.path.dirname(tmp_base)
        os.makedirs(cwd, exist_ok=True)
        log = []
        compiles = 0
        for line in script:
            commands = []
            # lit marks each line with the RUN line it came from: `%dbg(RUN: at line 2) cmd`.
            text = re.sub(r"^%dbg\([^)]*\)\s*", "", str(line))
            try:
                _commands(lit.ShUtil.ShParser(text, pipefail=True).parse(), commands)
            except ValueError as e:
                log.append(f"not parsed ({e}): {line}")
                continue
            for argv in commands:
                # The compiles, and LLVM's tools between them (llvm-ar makes a test's archive).
                tool = os.path.basename(argv[0]) if argv else ""
                if not (tool == "lit-cc" or tool.startswith("llvm-")):
                    continue
                compiles += 1
                r = subprocess.run(
                    argv, cwd=cwd, env=test.config.environment, capture_output=True, text=True
                )
                log.append(f"$ {' '.join(argv)}\n{r.stdout}{r.stderr}(status {r.returncode})")
        if compiles == 0:
            log.append("no compile in the RUN lines:\n" + "\n".join(str(s) for s in script))
        return lit.Test.Result(lit.Test.PASS, "\n".join(log))
