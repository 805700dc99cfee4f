# Wraps CMake for the two README commands. Run scripts/install-deps first on a
# fresh machine (it installs make itself, among the rest).
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS ?= 2
# clang 19, not Debian 12's default 14: from LLVM 18 on the sanitizer
# runtimes lock their allocator across fork(), so a fork()'s child that
# allocates cannot deadlock on a lock another thread held at the fork (the
# conformance fork cases do exactly that; clang 14 hung 1 in 20 of them
# under load, where glibc's malloc never does).
CLANG ?= clang-19

.PHONY: all build demo check install clean

all: build

build:
	./scripts/install-deps build
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(BUILD) -j$(JOBS)

# The main job: the access-token demo on the embedded store.
demo: build
	$(BUILD)/src/cli/dlock demo

# The whole suite: a plain gcc build (its programs also run under valgrind),
# then a clang build with AddressSanitizer + UBSan (and the libFuzzer targets)
# that runs every test against real servers the harness starts, then a
# ThreadSanitizer build of the core's tests and the SQLite and Redis
# conformance (ctest label "tsan").
check:
	./scripts/install-deps test
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(BUILD) -j$(JOBS)
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_C_COMPILER=$(CLANG) -DCMAKE_BUILD_TYPE=Debug -DDLOCK_SANITIZE=ON \
	      -DDLOCK_PLAIN_BUILD=$(abspath $(BUILD))
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_C_COMPILER=$(CLANG) -DCMAKE_BUILD_TYPE=Debug -DDLOCK_TSAN=ON \
	      -DDLOCK_BUILD_CLI=OFF
	cmake --build $(TSAN_BUILD) -j$(JOBS) --target test_core conformance
	cd $(TSAN_BUILD) && ctest -j$(JOBS) --output-on-failure --timeout 900 -L tsan
	cd $(ASAN_BUILD) && ctest -j$(JOBS) --output-on-failure --timeout 900

# Install the library, headers, dlock.pc, the CMake package, the tool, the
# store modules, the man pages, the docs and the shell completions under
# PREFIX (default /usr/local); DESTDIR stages a package. It never installs
# Debian packages: a build it needs is made with what is there.
PREFIX ?= /usr/local
install:
	test -f $(BUILD)/CMakeCache.txt || cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(BUILD) -j$(JOBS)
	DESTDIR=$(DESTDIR) cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
