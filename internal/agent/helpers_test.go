package agent

import (
	"os"
	"strconv"
	"strings"
)

func itoa(i int) string { return strconv.Itoa(i) }

func readFileString(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}
