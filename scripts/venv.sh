# Sourced by scripts/run, scripts/test and scripts/test-cluster: the checkout's .venv, created
# and filled with nodeguard where it is missing or out of date, saying what it does and showing
# pip's progress (a first install downloads about 40 packages: a minute or so).
#   venv_install EXTRAS     (EXTRAS: "" or "[test]")
venv_install() {
  local extras=$1 py=${PYTHON:-python3} stamp=.venv/.nodeguard-installed hash had=""
  if [ ! -x .venv/bin/python ]; then
    echo "== creating .venv ($("$py" --version 2>&1))" >&2
    "$py" -m venv .venv
  fi
  hash=$(sha256sum pyproject.toml | cut -d' ' -f1)
  [ -f "$stamp" ] && had=$(cat "$stamp")
  # Installed from this pyproject.toml, with these extras or more: nothing to do (the install
  # is editable, so code changes need none).
  if [ "$had" = "$hash $extras" ] || { [ -z "$extras" ] && [ "${had%% *}" = "$hash" ]; }; then
    return 0
  fi
  echo "== installing nodeguard$extras into .venv (editable; pip's progress follows)" >&2
  if ! .venv/bin/python -m pip install --disable-pip-version-check -e ".$extras" >&2; then
    echo "== pip install failed: see above" >&2
    return 1
  fi
  echo "$hash $extras" >"$stamp"
}
