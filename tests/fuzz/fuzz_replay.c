// fuzz_replay.c: a plain main() for compilers without libFuzzer: runs
// LLVMFuzzerTestOneInput over every file of the directories (or files) given,
// so the committed corpus runs in every build (ctest test_fuzz_request_corpus).
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, got);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    int files = 0;
    for (int a = 1; a < argc; a++) {
        struct stat st;
        if (stat(argv[a], &st) != 0) {
            fprintf(stderr, "fuzz_replay: %s: not found\n", argv[a]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            files += run_file(argv[a]) == 0;
            continue;
        }
        DIR *d = opendir(argv[a]);
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char p[4096];
            snprintf(p, sizeof(p), "%s/%s", argv[a], e->d_name);
            files += run_file(p) == 0;
        }
        closedir(d);
    }
    printf("fuzz_replay: %d inputs ran\n", files);
    return files > 0 ? 0 : 1;
}
