# Cross-compiling kiln for 64-bit Arm Linux (scripts/build --target aarch64) with Debian's
# g++-aarch64-linux-gnu against the arm64 multiarch packages of kiln's dependencies
# (/usr/lib/aarch64-linux-gnu, headers in /usr/include). Host tools (flatc, python) come from
# the host; the test binaries run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR), which is
# also how gtest_discover_tests lists them at build time.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Libraries and CMake package files only from the arm64 multiarch directories (and the
# architecture-independent /usr/share ones); programs from the host.
# build-aarch64/deps: the arm64 XNNPACK and pthreadpool packages, unpacked there by
# scripts/build-aarch64 (installing them would replace the host's); linked with a RUNPATH to it.
get_filename_component(KILN_AARCH64_DEPS "${CMAKE_CURRENT_LIST_DIR}/../build-aarch64/deps" ABSOLUTE)
set(CMAKE_FIND_ROOT_PATH ${KILN_AARCH64_DEPS} /usr/aarch64-linux-gnu /)
set(CMAKE_EXE_LINKER_FLAGS_INIT "-Wl,-rpath-link,${KILN_AARCH64_DEPS}/usr/lib/aarch64-linux-gnu")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
set(CMAKE_IGNORE_PATH /usr/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/cmake)
# pkg-config: the arm64 .pc files (libzip, libxxhash, libpcre2-8) and the shared ones
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)
