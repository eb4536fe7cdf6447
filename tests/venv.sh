# Sourced by the test scripts that need packages from PyPI.
#
# venv_ready VENV 'import a, b' PKG...: makes VENV a virtual environment
# whose python runs the import line, creating it afresh and installing
# PKG... only when it does not (so PyPI is asked once per build tree).
venv_ready() {
  local venv=$1 imports=$2
  shift 2
  "$venv/bin/python" -c "$imports" 2>/dev/null && return 0
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "$@"
}
