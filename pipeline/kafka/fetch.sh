#!/usr/bin/env bash
# Fetch the pinned Kafka broker jars (pom.xml next to this script) into <kafka_home>/libs.
#
#   bash pipeline/kafka/fetch.sh build/kafka        (what `make kafka` runs)
#
# Idempotent: skipped when <kafka_home>/libs/.stamp holds the sha256 of pom.xml, so a
# changed pin re-fetches into a clean libs/ (no stale jars of an older version remain).
# Needs Maven and Java 17; Maven Central is the only network access.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kafka_home="${1:-build/kafka}"
libs="$kafka_home/libs"
stamp="$libs/.stamp"
want="$(sha256sum "$here/pom.xml" | cut -d' ' -f1)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && compgen -G "$libs/kafka_2.13-*.jar" >/dev/null; then
  echo "kafka jars up to date in $libs"
  exit 0
fi

command -v mvn >/dev/null || { echo "fetch.sh: mvn not found (install Maven 3.8+)" >&2; exit 1; }
command -v java >/dev/null || { echo "fetch.sh: java not found (install Java 17)" >&2; exit 1; }

tmp="$libs.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
# (-q still prints bare ANSI resets; strip them. Maven prints its errors on stdout.)
mvn -q -B -Dstyle.color=never -f "$here/pom.xml" dependency:copy-dependencies \
  -DoutputDirectory="$(cd "$tmp" && pwd)" -DincludeScope=runtime | sed 's/\x1b\[[0-9;]*m//g'
rm -rf "$libs"
mv "$tmp" "$libs"
trap - EXIT
echo "$want" > "$stamp"
echo "kafka jars: $(ls "$libs"/*.jar | wc -l) in $libs"
