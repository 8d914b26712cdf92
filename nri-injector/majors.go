package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

// driverNamePrefixes are the /proc/devices names whose character majors are the Iluvatar driver's: the names its
// device nodes carry (iluvatar<N>, itrctl). Matched as prefixes, case-insensitively.
var driverNamePrefixes = []string{"iluvatar", "itr"}

// Majors are the character majors a GPU device node may have: the Iluvatar driver's, as /proc/devices names them,
// and those given by the operator (-device-majors), each with what it was known by.
type Majors map[int64]string

// Has says whether major is one of them.
func (m Majors) Has(major int64) bool {
	_, ok := m[major]
	return ok
}

// String is the set as the log names it: "508 (iluvatar), 509 (given)".
func (m Majors) String() string {
	if len(m) == 0 {
		return "none"
	}
	numbers := make([]int64, 0, len(m))
	for major := range m {
		numbers = append(numbers, major)
	}
	sort.Slice(numbers, func(i, j int) bool { return numbers[i] < numbers[j] })
	parts := make([]string, 0, len(numbers))
	for _, major := range numbers {
		parts = append(parts, fmt.Sprintf("%d (%s)", major, m[major]))
	}
	return strings.Join(parts, ", ")
}

// ParseGivenMajors reads the operator's list ("508,509"; empty: none).
func ParseGivenMajors(text string) (Majors, error) {
	given := Majors{}
	for _, field := range strings.FieldsFunc(text, func(r rune) bool { return r == ',' || r == ' ' }) {
		major, err := strconv.ParseInt(field, 10, 64)
		if err != nil || major < 0 || major > 4095 {
			return nil, fmt.Errorf("-device-majors (DEVICE_MAJORS): %q is not a character major (0-4095)", field)
		}
		given[major] = "given"
	}
	return given, nil
}

// DriverMajors reads the character majors of the Iluvatar driver from a /proc/devices listing: the lines
// "<major> <name>" of its "Character devices:" section whose name is the driver's.
func DriverMajors(listing io.Reader) (Majors, error) {
	found := Majors{}
	section := ""
	scanner := bufio.NewScanner(listing)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if strings.HasSuffix(line, ":") {
			section = line
			continue
		}
		fields := strings.Fields(line)
		if section != "Character devices:" || len(fields) != 2 {
			continue
		}
		major, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil || !driverName(fields[1]) {
			continue
		}
		found[major] = fields[1]
	}
	return found, scanner.Err()
}

func driverName(name string) bool {
	lower := strings.ToLower(name)
	for _, prefix := range driverNamePrefixes {
		if strings.HasPrefix(lower, prefix) {
			return true
		}
	}
	return false
}

// AllowedMajors are the majors a node may have now: the driver's in procDevices (read again at every use, so a
// driver loaded or reloaded since is known) and the given ones.
func AllowedMajors(procDevices string, given Majors) (Majors, error) {
	allowed := Majors{}
	file, err := os.Open(procDevices)
	if err != nil {
		if len(given) == 0 {
			return nil, fmt.Errorf("reading the kernel's device majors in %s: %w", procDevices, err)
		}
	} else {
		defer file.Close()
		driver, err := DriverMajors(io.LimitReader(file, 1<<20))
		if err != nil {
			return nil, fmt.Errorf("reading the kernel's device majors in %s: %w", procDevices, err)
		}
		for major, name := range driver {
			allowed[major] = name
		}
	}
	for major, name := range given {
		allowed[major] = name
	}
	return allowed, nil
}
