/*
 * version.c - the project's version (flx/cli.h: flx_version, flx_version_git).
 *
 * FLX_VERSION is CMake's PROJECT_VERSION (a compile definition of this file). The git description
 * comes from flx_git_describe.h, which common/version.cmake rewrites at every build, only when it
 * changed, so a new commit recompiles this one file. A build outside CMake (bench/model's reference
 * tools) may define both macros on the command line instead.
 */
#include "flx/cli.h"

#if !defined(FLX_GIT_DESCRIBE) && defined(__has_include)
#if __has_include("flx_git_describe.h")
#include "flx_git_describe.h"
#endif
#endif
#ifndef FLX_GIT_DESCRIBE
#define FLX_GIT_DESCRIBE ""
#endif
#ifndef FLX_VERSION
#define FLX_VERSION "unknown"
#endif

const char *flx_version(void)
{
    return FLX_VERSION;
}

const char *flx_version_git(void)
{
    return FLX_GIT_DESCRIBE;
}
